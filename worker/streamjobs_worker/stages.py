"""Stage operators; each runs its batch on the worker's SparkSession.

`sql` and `pyspark` are stateless. `window_aggregate` lets Spark compute the
batch's partial aggregates per (key, window) and merges them into keyed state;
`stateful` hands the user function the batch and the state of the batch's keys.
Both keep state per key group (state.py) so it can be restored and moved per
key group, as Arrow tables: what Spark returns merges into state, and state
goes to Spark, over whole columns, never a Python loop per key.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core.keygroups import key_groups_of
from streamjobs_core.spec import StatefulStage, WindowAggregateStage
from streamjobs_core.statelog import state_layout
from streamjobs_core.watermarks import MAX_WATERMARK, MIN_WATERMARK

from . import phases, pushdown, spark
from .state import KG, KeyGroupStore, groups_of, last_per_key, per_key_group, replace_rows, take


def load_function(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def view_name(op: str) -> str:
    return op.replace("-", "_")


@dataclass(frozen=True)
class LateRecords:
    """Records of one input that a stage met behind their key group's watermark: the window or join they
    belonged to had moved on. The chain dead-letters each with its reason (never only a metric)."""

    upstream: str
    rows: pa.Table  # as the stage met them
    reasons: list[str]  # per row: the window it missed, or the watermark it was behind


class _SparkStage:
    def __init__(self, spec, store: KeyGroupStore) -> None:
        self.spec = spec
        self.store = store
        self.spark = spark.session()
        self._schemas: dict[str, pa.Schema] = {}
        self.late: list[LateRecords] = []  # met by batches that went through, since the chain last took them
        self._read_views = self._views()
        self._kept: dict[tuple[str, ...], list[str]] = {}  # _columns per input's column names
        # pushdown.py: per input and schema, the filter its rows pass before Spark (None: none), once learned
        # from a plan; and the inputs of the batch at hand whose filter its plan is to tell (their relation ids)
        self._pushed: dict[tuple[str, pa.Schema], Any] = {}
        self._learning: dict[str, int] = {}

    def reconfigure(self, spec) -> None:
        """A live change (reconfigure.py) to fields the state does not depend on: the state stays."""
        self.spec = spec
        self._read_views = self._views()
        self._kept = {}
        self._pushed = {}

    # Whether the stage calls _learn_pushdown with the query that reads its inputs (pushdown.py)
    _pushes_down = False

    def _views(self) -> set[str]:
        """The views the stage's query reads: `input` (the union) and each input by its name. Registering
        one costs a round trip and an analysis in the JVM: a stage registers only those it reads."""
        return set()

    def _columns(self, names: list[str]) -> list[str]:
        """Those of an input's columns the stage's query may read (every one unless the stage can tell). Each
        column sent costs the JVM a conversion per record: the largest part of a simple stage's work."""
        return names

    def _kept_of(self, names: list[str]) -> list[str]:
        known = self._kept.get(key := tuple(names))
        if known is None:
            known = self._kept[key] = self._columns(names)
        return known

    def _register_inputs(self, batch) -> Any:
        """Register the views the stage reads (each input, and their union as `input`); return the union."""
        views = self._read_views
        union = None
        for upstream in self.spec.inputs:
            table = batch.table(upstream)
            if table is not None and len(kept := self._kept_of(table.column_names)) < table.num_columns:
                table = table.select(kept)
            if table is not None:
                self._schemas[upstream] = table.schema
            elif upstream in self._schemas:
                table = self._schemas[upstream].empty_table()
            else:
                continue
            learn = self._pushes_down and table.num_rows and (upstream, table.schema) not in self._pushed
            if self._pushes_down and not learn:
                table = self._filtered(upstream, table)
            with phases.phase("to_jvm"):
                frame = spark.bridge(self.spark).frame(table)
                if learn:
                    self._learning[upstream] = pushdown.relation_id(frame)
                # One chunk, one partition: Spark would otherwise make a partition per tiny entry, and an
                # aggregation over a single partition needs no exchange.
                df = frame.coalesce(1)
            if self.spec.where:
                df = df.filter(self.spec.where)
            if view_name(upstream) in views:
                df.createOrReplaceTempView(view_name(upstream))
            union = df if union is None else union.unionByName(df, allowMissingColumns=True)
        if "input" in views:
            union.createOrReplaceTempView("input")
        return union

    def _filtered(self, upstream: str, table: pa.Table) -> pa.Table:
        pushed = self._pushed.get((upstream, table.schema))
        if pushed is None or not table.num_rows:
            return table
        try:
            return table.filter(pushed)
        except pa.ArrowException:  # a type Arrow cannot compare so (a dictionary, say): Spark alone filters
            self._pushed[(upstream, table.schema)] = None
            return table

    def _learn_pushdown(self, df) -> None:
        """What the plan of `df`, the query over this batch's inputs, lets later batches filter first."""
        if self._learning:
            schemas = {name: self._schemas[name] for name in self._learning}
            for name, pushed in pushdown.learned(df, self._learning).items():
                self._pushed[(name, schemas[name])] = pushed
            self._learning = {}

    def restore(self, watermarks: dict[int, int] | None = None) -> None:
        """Stateless stages have nothing to rebuild."""

    def watermarks(self) -> dict[int, int]:
        """Per owned key group, the watermark every timer fired before (stages without timers: none)."""
        return {}

    def acquire(self, kg: int, watermark: int = MIN_WATERMARK) -> None:
        """A key group taken over mid-run (its state is in the store): stages without timers need nothing."""

    def release(self, kg: int) -> None:
        """A key group handed over (its state leaves the store): stages without timers need nothing."""


# SQL that may read columns it does not name: a star where a column or argument list goes (SELECT *, t.*,
# struct(*); count(*) reads none, `a * b` is a product), NATURAL joins and USING clauses; and any SQL with a
# comment, which may hide the star's place.
_COUNT_ROWS = re.compile(r"\bcount\s*\(\s*\*\s*\)", re.IGNORECASE)
_UNNAMED_COLUMNS = re.compile(r"(?:^|\bselect|\bdistinct|\ball|[,(.])\s*\*|\bnatural\b|\busing\b", re.IGNORECASE)


def mentioned(names: list[str], sql: str, also: set[str] = frozenset()) -> list[str]:
    """The columns among `names` that `sql` may read: those it names (case aside, as Spark resolves them,
    quoted or not; a name in a string literal or comment counts too, which costs only its conversion), or
    every one where it may read columns it does not name. `also`: columns kept whatever the text says."""
    if "--" in sql or "/*" in sql or _UNNAMED_COLUMNS.search(_COUNT_ROWS.sub("", sql)):
        return names  # a comment may stand between SELECT and its star (`SELECT -- all\n *`)
    named = [name for name in names if name in also
             or re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", sql, re.IGNORECASE)]
    return named or names[:1]  # a batch without columns would lose its row count on the way


class SqlStage(_SparkStage):
    _pushes_down = True

    def _views(self) -> set[str]:
        names = {"input", *(view_name(u) for u in self.spec.inputs)}
        return {name for name in names if re.search(rf"\b{re.escape(name)}\b", self.spec.query, re.IGNORECASE)}

    def _columns(self, names: list[str]) -> list[str]:
        return mentioned(names, f"{self.spec.query}\n{self.spec.where or ''}")

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        self._register_inputs(batch)
        with phases.phase("plan"):
            df = self.spark.sql(self.spec.query)
            self._learn_pushdown(df)
        return collect(df), watermark


class PySparkStage(_SparkStage):
    def __init__(self, spec, store: KeyGroupStore) -> None:
        super().__init__(spec, store)
        self._fn = load_function(spec.function)

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        df = self._register_inputs(batch)
        with phases.phase("plan"):
            result = self._fn(df)
        return collect(result), watermark


_PARTIALS = {"count": ("count(*)",), "sum": ("sum({c})",), "avg": ("sum({c})", "count({c})"),
             "min": ("min({c})",), "max": ("max({c})",)}
# How two partials of one (key, window) merge: counts and sums add up.
_MERGES = {"count": ("sum",), "sum": ("sum",), "avg": ("sum", "sum"), "min": ("min",), "max": ("max",)}

_LOCAL_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
_LOCAL_STATE_BYTES = 4 << 20

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


class _EventTimeStage(_SparkStage):
    """A stage with timers in event time, kept per key group: a key group taken over from another instance
    resumes at its own streams' progress, which may lag this instance's other key groups."""

    def __init__(self, spec, store: KeyGroupStore) -> None:
        super().__init__(spec, store)
        self._watermarks: dict[int, int] = {}

    def restore(self, watermarks: dict[int, int] | None = None) -> None:
        for kg in self.store.key_groups:
            self.acquire(kg, (watermarks or {}).get(kg, MIN_WATERMARK))

    def acquire(self, kg: int, watermark: int = MIN_WATERMARK) -> None:
        """`watermark`: the key group's committed input watermark, which every timer fired before (a late
        record after a restart or handover must not open such a window again)."""
        self._watermarks[kg] = watermark

    def release(self, kg: int) -> None:
        self._watermarks.pop(kg, None)

    def watermarks(self) -> dict[int, int]:
        return dict(self._watermarks)

    def _fired_before(self, kg: int) -> int:
        return self._watermarks.get(kg, MIN_WATERMARK)

    def _advance(self, batch, watermark: int) -> None:
        """Each owned key group's watermark after the batch (never back)."""
        for kg in self.store.key_groups:
            mark = watermark if watermark == MAX_WATERMARK else batch.watermarks.get(kg, watermark)
            self._watermarks[kg] = max(self._fired_before(kg), mark)


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
        self._register_inputs(batch)
        with phases.phase("plan"):
            df = self.spark.sql(partial_sql(self.spec))
            self._learn_pushdown(df)
        partials = collect(df)
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


class Stateful(_SparkStage):
    """User function (batch DataFrame, state DataFrame) -> (output DataFrame, new state DataFrame).

    The state DataFrame has the key column and the stateSchema columns, one row
    per key of the batch that has state. A returned state row replaces the key's
    state; a row whose state columns are all null deletes it. State is a row per
    key (state.py), handed to Spark and read back as Arrow.
    """

    spec: StatefulStage

    def __init__(self, spec: StatefulStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store)
        store.bind(state_layout(spec))
        self._fn = load_function(spec.function)
        self._max_parallelism = max_parallelism
        self._state_fields = self.spark.createDataFrame([], spec.state_schema).schema.fields

    def reconfigure(self, spec: StatefulStage) -> None:
        """A new function over the same stateSchema (reconfigure.py refuses another schema)."""
        super().reconfigure(spec)
        self._fn = load_function(spec.function)

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        df = self._register_inputs(batch)
        spark_schema = StructType([df.schema[self.spec.key_by], *self._state_fields])
        schema = to_arrow_schema(spark_schema)
        with phases.phase("state"):
            rows = self._state_of(batch, schema)
        with phases.phase("to_jvm"):
            state = state_frame(self.spark, rows, spark_schema)
        with phases.phase("plan"):
            out, new_state = self._fn(df, state)
        # Both results before any state changes: a batch that fails leaves the state as it was.
        output, updates = collect_both(out, new_state)
        with phases.phase("state"):
            self._save(updates, schema)
        return output, watermark

    def _state_of(self, batch, schema: pa.Schema) -> pa.Table:
        """The state rows of the batch's keys."""
        key = self.spec.key_by
        key_type = schema.field(key).type
        tables = [batch.table(u) for u in self.spec.inputs]
        keys = pc.unique(pa.chunked_array([t.column(key).cast(key_type) for t in tables if t is not None],
                                          type=key_type))
        rows = self.store.read(np.unique(key_groups_of(keys, self._max_parallelism)))
        if rows is None:
            return schema.empty_table()
        rows = rows.filter(pc.is_in(rows.column(key), value_set=keys, skip_nulls=False))
        return rows.select(schema.names).cast(schema)

    def _save(self, updates: pa.Table, schema: pa.Schema) -> None:
        """Upsert the new state rows, delete the keys whose state columns are all null."""
        key = self.spec.key_by
        columns = []
        for field in schema:
            if field.name not in updates.column_names:
                raise ValueError(f"{self.spec.name}: the new state has no column '{field.name}' "
                                 f"(it needs {', '.join(schema.names)})")
            try:
                columns.append(updates.column(field.name).cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise ValueError(f"{self.spec.name}: new state column '{field.name}' is not {field.type}: {exc}") from exc
        updates = pa.Table.from_arrays(columns, schema=schema)
        if not updates.num_rows:
            return
        if pc.count_distinct(updates.column(key), mode="all").as_py() < updates.num_rows:
            updates = last_per_key(updates, [key])  # one key returned twice: its last row wins
        kgs = key_groups_of(updates.column(key), self._max_parallelism)
        strays = ~np.isin(kgs, self.store.key_groups)
        if strays.any():
            stray = updates.column(key)[int(np.flatnonzero(strays)[0])].as_py()
            raise ValueError(f"{self.spec.name}: new state for key {stray!r}, of key group "
                             f"{int(kgs[strays][0])} that this instance does not own")
        updates = updates.append_column(KG, pa.array(kgs))
        names = [f.name for f in self._state_fields]
        gone = pc.is_null(updates.column(names[0]))
        for name in names[1:]:
            gone = pc.and_(gone, pc.is_null(updates.column(name)))
        upserts = updates.filter(pc.invert(gone))
        deletes = updates.filter(gone).select([key, KG])

        def merge(current: pa.Table | None):
            if current is None:
                return upserts, upserts, None
            existed = deletes.filter(pc.is_in(deletes.column(key), value_set=current.column(key), skip_nulls=False))
            return replace_rows(current, upserts, deletes, key), upserts, existed

        self.store.update(0, np.unique(kgs), merge)


def state_frame(spark_session, table: pa.Table, schema):
    """State as a DataFrame of one partition (a partition per chunk otherwise). Small state becomes a local
    relation, which Spark joins by broadcast without a shuffle, as it would below its default threshold:
    the worker sets that threshold to 0 so that batches stay columnar."""
    table = table.combine_chunks()
    if table.nbytes > _LOCAL_STATE_BYTES:
        return spark_session.createDataFrame(table, schema)
    previous = spark_session.conf.get(_LOCAL_THRESHOLD, None)
    spark_session.conf.set(_LOCAL_THRESHOLD, str(_LOCAL_STATE_BYTES))
    try:
        return spark_session.createDataFrame(table, schema)
    finally:
        if previous is None:
            spark_session.conf.unset(_LOCAL_THRESHOLD)
        else:
            spark_session.conf.set(_LOCAL_THRESHOLD, previous)


def collect_both(first, second) -> tuple[pa.Table, pa.Table]:
    """Two DataFrames as Arrow in one Spark job: each as a struct column of one union, the other's null.

    One job instead of two halves the fixed cost (planning, scheduling) of a stateful batch. A result
    without columns, or with one name twice, cannot be a struct: such results are collected one by one.
    """
    from pyspark.sql import functions as F

    if any(not df.columns or len(set(df.columns)) < len(df.columns) for df in (first, second)):
        return collect(first), collect(second)

    def nested(df):
        return F.struct(*[F.col("`" + c.replace("`", "``") + "`") for c in df.columns]).cast(_nullable(df.schema))

    both = first.select(nested(first).alias("a"), F.lit(None).cast(_nullable(second.schema)).alias("b")).union(
        second.select(F.lit(None).cast(_nullable(first.schema)).alias("a"), nested(second).alias("b")))
    table = collect(both)
    return _unnest(table, "a", first), _unnest(table, "b", second)


def collect(df) -> pa.Table:
    """Run the query and bring its result back as Arrow. Under a profile (phases.py) the physical plan is
    made first, so planning and execution are told apart (the plan is made once either way)."""
    if phases.active():
        with phases.phase("plan"):
            df._jdf.queryExecution().executedPlan()
    with phases.phase("execute"):
        return spark.bridge(df.sparkSession).table(df)


def _nullable(schema):
    """The struct type with every field nullable, nested structs too: the other branch's rows are null."""
    from pyspark.sql.types import StructField, StructType

    def loose(kind):
        return _nullable(kind) if isinstance(kind, StructType) else kind

    return StructType([StructField(f.name, loose(f.dataType), True) for f in schema.fields])


def _unnest(table: pa.Table, name: str, df) -> pa.Table:
    """One DataFrame's rows of the union, typed as its own toArrow() would type them."""
    from pyspark.sql.pandas.types import to_arrow_schema

    large = df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    schema = to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                             prefers_large_types=large)
    column = table.column(name)
    rows = column.filter(pc.is_valid(column)).combine_chunks()
    return pa.Table.from_struct_array(rows).cast(schema) if len(rows) else schema.empty_table()


class StageBroken(ValueError):
    """A mistake in the job that every batch would meet (a function that does not import, a query Spark refuses):
    the operator and Python's (or Spark's) words. No restart mends it: the job fails."""


def build_stage(spec, store: KeyGroupStore, max_parallelism: int, r=None):
    """make_stage, its failures (a function that does not import, a spec the stage refuses) a StageBroken."""
    try:
        return make_stage(spec, store, max_parallelism, r)
    except Exception as exc:  # noqa: BLE001 - anything a function's import raises is the job's mistake
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        raise StageBroken(f"{spec.name}: cannot be built: {type(exc).__name__}: {lines[0] if lines else ''}") from None


def make_stage(spec, store: KeyGroupStore, max_parallelism: int, r=None):
    """`r`: the job's Redis, where a lookup stage's table may live."""
    if spec.type == "lookup":
        from .lookup import LookupStage  # it builds on this module's stage base

        return LookupStage(spec, store, r)
    if spec.type == "join":
        from .join import make_join  # it builds on this module's event-time stage

        return make_join(spec, store, max_parallelism)
    if spec.type == "over":
        from .over import Over  # it builds on this module's event-time stage

        return Over(spec, store, max_parallelism)
    if spec.type == "sql":
        return SqlStage(spec, store)
    if spec.type == "pyspark":
        return PySparkStage(spec, store)
    if spec.type == "window_aggregate":
        return WindowAggregate(spec, store, max_parallelism)
    return Stateful(spec, store, max_parallelism)
