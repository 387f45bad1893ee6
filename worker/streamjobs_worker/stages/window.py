"""Keyed event-time windows: Spark computes the batch's partial aggregates per (key, window), merged into
keyed state and fired per key group as its watermark passes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core.keygroups import key_groups_of
from streamjobs_core.spec import WindowAggregateStage
from streamjobs_core.statelog import state_layout
from streamjobs_core.watermarks import MAX_WATERMARK, MIN_WATERMARK

from .. import phases, spark
from ..state import KG, KeyGroupStore, groups_of, per_key_group, take
from .base import LateRecords, _EventTimeStage, collect, mentioned

_PARTIALS = {"count": ("count(*)",), "sum": ("sum({c})",), "avg": ("sum({c})", "count({c})"),
             "min": ("min({c})",), "max": ("max({c})",)}
# How two partials of one (key, window) merge: counts and sums add up.
_MERGES = {"count": ("sum",), "sum": ("sum",), "avg": ("sum", "sum"), "min": ("min",), "max": ("max",)}

_NEW = "_new"


def panes(spec: WindowAggregateStage) -> int:
    """Slides per window where a window is made of whole slides (panes), else 1 (tumbling windows: the pane
    is the window; a size that is no multiple of the slide: each record goes to its windows in Spark)."""
    size, step = spec.window.size_ms, spec.window.step_ms
    return size // step if size % step == 0 else 1


def partial_sql(spec: WindowAggregateStage) -> str:
    """Per (key, start) partial aggregates of the batch (its late records taken out before): the start of the
    record's pane, which WindowAggregate spreads to the windows holding it, where windows are whole panes (a
    record is aggregated once, not once per window: 5x fewer rows for Q5's 10 s windows sliding by 2 s); else
    the start of each of its windows."""
    size, step = spec.window.size_ms, spec.window.step_ms
    last = f"(event_time - pmod(event_time, {step}))"
    if size == step or panes(spec) > 1:
        source = f"(SELECT *, {last} AS ws FROM input)"
    else:
        source = f"(SELECT *, explode(sequence({last} - {size - step}, {last}, {step})) AS ws FROM input)"
    parts = [
        expr.format(c=f"`{agg.column}`") + f" AS p{i}_{j}"
        for i, agg in enumerate(spec.aggregations)
        for j, expr in enumerate(_PARTIALS[agg.function])
    ]
    return (f"SELECT `{spec.key_by}` AS k, ws, {', '.join(parts)} FROM {source} "
            f"GROUP BY `{spec.key_by}`, ws")


def partial_names(spec: WindowAggregateStage) -> list[str]:
    return [f"p{i}_{j}" for i, agg in enumerate(spec.aggregations) for j in range(len(_PARTIALS[agg.function]))]


def window_state_rows(spec: WindowAggregateStage, keys: pa.Array, window_start: int) -> pa.Table:
    """State rows of `keys` in a window no record reached yet (partials null): e.g. a benchmark's ballast,
    in a window that never fires."""
    columns = {"k": keys, "ws": pa.array(np.full(len(keys), window_start, dtype=np.int64))}
    columns.update({name: pa.nulls(len(keys)) for name in partial_names(spec)})
    return pa.table(columns)


def _partial(rows: pa.Table, name: str) -> pa.Array | pa.ChunkedArray:
    """A partial of the windows due; null for an aggregation added live that no record of theirs reached."""
    return rows.column(name) if name in rows.column_names else pa.nulls(rows.num_rows)


def final_value(function: str, partials: list) -> pa.Array | pa.ChunkedArray:
    if function == "avg":
        total, count = partials
        ratio = pc.divide(pc.cast(total, pa.float64()), pc.cast(count, pa.float64()))
        return pc.if_else(pc.greater(count, 0), ratio, pa.scalar(None, pa.float64()))
    return partials[0]


class WindowAggregate(_EventTimeStage):
    """Keyed event-time windows that fire once: when end + allowed lateness <= the key group's watermark.

    State holds a row per (key, window
    start) with the window's partial aggregates, a segment per window start (state.py): a batch's
    partials merge into the segments of their windows (one group_by per window), and windows fire by
    taking their segments out, per key group against its own watermark.
    """

    _pushes_down = True

    spec: WindowAggregateStage

    def __init__(self, spec: WindowAggregateStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store)
        store.bind(state_layout(spec))
        self._max_parallelism = max_parallelism
        self._aggregations()

    def reconfigure(self, spec: WindowAggregateStage) -> None:
        """Besides what any stage may change live, aggregations added after the others (reconfigure.py): rows
        in the state have no partials for them, which read as null and merge as nothing."""
        super().reconfigure(spec)
        self._aggregations()

    def _aggregations(self) -> None:
        self._partials = partial_names(self.spec)
        self._merges = list(zip(self._partials, (m for a in self.spec.aggregations for m in _MERGES[a.function])))

    def _views(self) -> set[str]:
        return {"input"}  # partial_sql's

    def _columns(self, names: list[str]) -> list[str]:
        read = {self.spec.key_by, "event_time", *self._aggregated}
        if self.spec.where:
            return mentioned(names, self.spec.where, also=read)
        return [name for name in names if name in read]

    @property
    def _aggregated(self) -> set[str]:
        return {agg.column for agg in self.spec.aggregations if agg.column}

    @property
    def _horizon(self) -> int:
        return self.spec.window.size_ms + self.spec.allowed_lateness_ms

    def _bounds(self) -> dict[int, int]:
        """Per owned key group, the last window start that has fired (end + allowed lateness <= watermark)."""
        floor = MIN_WATERMARK + self.spec.window.size_ms  # the late test subtracts up to a window size from it
        return {kg: max(self._fired_before(kg) - self._horizon, floor) for kg in self.store.key_groups}

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        late: list[LateRecords] = []
        if batch.records:
            batch = self._without_late(batch, late)
            if batch.records:
                self._add(batch)
        self._advance(batch, watermark)
        with phases.phase("state"):
            out = self._fire()
        self.late.extend(late)
        lateness = self.spec.allowed_lateness_ms
        out_watermark = watermark if watermark == MAX_WATERMARK else watermark - lateness
        return out, out_watermark

    def _without_late(self, batch, late: list[LateRecords]):
        """The batch without its records whose last window has fired in their key group (Flink's late
        elements: every window holding them is gone), which go to `late` with that window named. A record
        the stage's `where` drops is never late."""
        fired = per_key_group(self._bounds(), self._max_parallelism, MIN_WATERMARK + self.spec.window.size_ms)
        step, size = self.spec.window.step_ms, self.spec.window.size_ms
        tables: dict[str, list[pa.Table]] = {}
        records = 0
        for upstream in self.spec.inputs:
            table = batch.table(upstream)
            if table is None or not table.num_rows:
                continue
            times = table.column("event_time").fill_null(MAX_WATERMARK).to_numpy()
            last = times - np.mod(times, step)
            # Only a record whose last window fired in some key group may be late: only its key is hashed.
            found = np.flatnonzero(last <= fired.max())
            if found.size:
                kgs = key_groups_of(table.column(self.spec.key_by).take(pa.array(found)), self._max_parallelism)
                late_here = last[found] <= fired[kgs]
                found, kg_of = found[late_here], dict(zip(found[late_here].tolist(), kgs[late_here].tolist()))
            if found.size:
                kept = np.ones(table.num_rows, dtype=bool)
                kept[found] = False
                found = self._kept_by_where(table, found)
                reasons = [f"late: its last window [{last[i]}, {last[i] + size}) had fired in key group "
                           f"{kg_of[i]} (watermark {self._fired_before(kg_of[i])}, allowedLatenessMs "
                           f"{self.spec.allowed_lateness_ms})" for i in found.tolist()]
                if found.size:
                    late.append(LateRecords(upstream, table.take(pa.array(found)), reasons))
                table = table.filter(pa.array(kept))
            tables[upstream] = [table]
            records += table.num_rows
        return replace(batch, tables=tables, records=records)

    def _kept_by_where(self, table: pa.Table, rows: np.ndarray) -> np.ndarray:
        """Those of `rows` the stage's `where` keeps (one Spark query, only when late records were met)."""
        if not self.spec.where:
            return rows
        candidates = table.take(pa.array(rows)).append_column("_late_row", pa.array(rows))
        kept = collect(spark.bridge(self.spark).frame(candidates).filter(self.spec.where).select("_late_row"))
        return np.sort(kept.column("_late_row").to_numpy())

    def _add(self, batch) -> None:
        partials = self._query(batch, partial_sql(self.spec))
        if not partials.num_rows:
            return
        with phases.phase("state"):
            self._merge(partials)

    def _merge(self, partials: pa.Table) -> None:
        if partials.column("ws").null_count:
            raise ValueError(f"{self.spec.name}: a record has no event_time")
        kgs = key_groups_of(partials.column("k"), self._max_parallelism)
        if (n := panes(self.spec)) > 1:
            partials, kgs = self._windows_of_panes(partials, n), np.repeat(kgs, n)
        starts = partials.column("ws").to_numpy()
        fired = per_key_group(self._bounds(), self._max_parallelism, MIN_WATERMARK + self.spec.window.size_ms)[kgs]
        opened = starts > fired  # a record's windows that fired before its last one: as in Flink, dropped
        if not opened.any():
            return
        rows = partials.select(["k", "ws", *self._partials]).append_column(KG, pa.array(kgs))
        if not opened.all():
            rows, starts, kgs = rows.filter(pa.array(opened)), starts[opened], kgs[opened]
        windows = groups_of(starts)
        for start, positions in windows:
            part = rows if len(windows) == 1 else take(rows, positions)
            self.store.update(start, np.unique(kgs[positions]), self._merge_into(part))

    def _windows_of_panes(self, partials: pa.Table, n: int) -> pa.Table:
        """Each pane's partials once per window holding it: starts pane, pane - slide, ... (n windows)."""
        step = self.spec.window.step_ms
        rows = partials.take(pa.array(np.repeat(np.arange(partials.num_rows), n)))
        starts = np.repeat(partials.column("ws").to_numpy(), n) - np.tile(np.arange(n, dtype=np.int64) * step,
                                                                          partials.num_rows)
        return rows.set_column(rows.schema.get_field_index("ws"), "ws", pa.array(starts, rows.schema.field("ws").type))

    def _merge_into(self, part: pa.Table):
        """How one window's partials of the batch merge into its state: (state, rows changed, rows deleted)."""

        def merge(current: pa.Table | None):
            if current is None and panes(self.spec) == 1:
                return part, part, None  # a row per key: Spark grouped them by key and window
            tables = [part.append_column(_NEW, pa.repeat(True, part.num_rows))]  # panes: a row per key and pane
            if current is not None:
                tables.insert(0, current.append_column(_NEW, pa.repeat(False, current.num_rows)))
            both = pa.concat_tables(tables, promote_options="permissive")
            # By key alone: the window start is the segment's, the key group the key's (hashing less is faster).
            grouped = both.group_by("k", use_threads=False).aggregate(
                [("ws", "min"), *self._merges, (KG, "min"), (_NEW, "max")])
            columns = {"k": grouped.column("k"), "ws": grouped.column("ws_min")}
            columns.update({name: grouped.column(f"{name}_{how}") for name, how in self._merges})
            columns[KG] = grouped.column(f"{KG}_min")
            # In the state's column order, partials of aggregations added live after its key group: those
            # are null in rows from before, even a count's, which Spark declares non-nullable.
            target = both.schema.remove(both.schema.get_field_index(_NEW))
            target = pa.schema([f.with_nullable(True) for f in target])
            merged = pa.table(columns).select(target.names).cast(target)
            return merged, merged.filter(grouped.column(f"{_NEW}_max")), None

        return merge

    def _fire(self) -> pa.Table | None:
        due = self.store.cut(self._bounds())
        if due is None:
            return None
        due = due.take(pc.sort_indices(due.column("ws")))  # windows in the order they end
        ends = pc.add(due.column("ws"), self.spec.window.size_ms)
        columns = {self.spec.key_by: due.column("k"), "window_start": due.column("ws"), "window_end": ends}
        names = iter(self._partials)
        for agg in self.spec.aggregations:
            columns[agg.as_] = final_value(agg.function, [_partial(due, next(names)) for _ in _PARTIALS[agg.function]])
        # Results carry the window's last instant as event time and its end as the
        # time latency is measured from (event time to sink).
        columns["event_time"] = pc.subtract(ends, 1)
        columns["_ingest_ms"] = ends
        return pa.table(columns)
