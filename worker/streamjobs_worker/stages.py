"""Stage operators; each runs its batch on the worker's SparkSession.

`sql` and `pyspark` are stateless. `window_aggregate` lets Spark compute the
batch's partial aggregates per (key, window) and merges them into keyed state;
`stateful` hands the user function the batch and the state of the batch's keys.
Both keep state per key group (state.py) so it can be restored and moved per
key group.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core.generators import MAX_WATERMARK
from streamjobs_core.keygroups import key_groups_of
from streamjobs_core.spec import StatefulStage, WindowAggregateStage

from . import spark
from .inputs import MIN_WATERMARK
from .state import KeyGroupStore


def load_function(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def view_name(op: str) -> str:
    return op.replace("-", "_")


class _SparkStage:
    def __init__(self, spec, store: KeyGroupStore) -> None:
        self.spec = spec
        self.store = store
        self.spark = spark.session()
        self._schemas: dict[str, pa.Schema] = {}
        self.late_records = 0  # records dropped as late since the worker last read this

    def _register_inputs(self, batch) -> Any:
        """Register each input and their union (`input`) as views; return the union DataFrame."""
        union = None
        for upstream in self.spec.inputs:
            table = batch.table(upstream)
            if table is not None:
                self._schemas[upstream] = table.schema
            elif upstream in self._schemas:
                table = self._schemas[upstream].empty_table()
            else:
                continue
            # One chunk: Spark would otherwise make a partition per tiny entry.
            df = self.spark.createDataFrame(table.combine_chunks())
            if self.spec.where:
                df = df.filter(self.spec.where)
            df.createOrReplaceTempView(view_name(upstream))
            union = df if union is None else union.unionByName(df, allowMissingColumns=True)
        union.createOrReplaceTempView("input")
        return union

    def restore(self, watermarks: dict[int, int] | None = None) -> None:
        """Stateless stages have nothing to rebuild."""

    def acquire(self, kg: int, watermark: int = MIN_WATERMARK) -> None:
        """A key group taken over mid-run (its state is in the store): stages without timers need nothing."""

    def release(self, kg: int) -> None:
        """A key group handed over (its state leaves the store): stages without timers need nothing."""


class SqlStage(_SparkStage):
    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        self._register_inputs(batch)
        return self.spark.sql(self.spec.query).toArrow(), watermark


class PySparkStage(_SparkStage):
    def __init__(self, spec, store: KeyGroupStore) -> None:
        super().__init__(spec, store)
        self._fn = load_function(spec.function)

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        df = self._register_inputs(batch)
        return self._fn(df).toArrow(), watermark


_PARTIALS = {"count": ("count(*)",), "sum": ("sum({c})",), "avg": ("sum({c})", "count({c})"),
             "min": ("min({c})",), "max": ("max({c})",)}


def partial_sql(spec: WindowAggregateStage) -> str:
    """Per (key, window start) partial aggregates of the batch, and per group `_l<j>`: how many of its rows
    have their last window j steps after this one (a record is late when its last window has fired,
    which the worker decides per key group)."""
    size, step = spec.window.size_ms, spec.window.step_ms
    last = f"(event_time - pmod(event_time, {step}))"
    if size == step:  # tumbling: one window per record, no explode
        source = f"(SELECT *, {last} AS ws FROM input)"
    else:
        source = f"(SELECT *, explode(sequence({last} - {size - step}, {last}, {step})) AS ws FROM input)"
    parts = [
        expr.format(c=f"`{agg.column}`") + f" AS p{i}_{j}"
        for i, agg in enumerate(spec.aggregations)
        for j, expr in enumerate(_PARTIALS[agg.function])
    ]
    lasts = [f"sum(CASE WHEN {last} = ws + {j * step} THEN 1 ELSE 0 END) AS _l{j}" for j in range(size // step)]
    return (f"SELECT `{spec.key_by}` AS k, ws, {', '.join(parts + lasts)} FROM {source} "
            f"GROUP BY `{spec.key_by}`, ws")


def merge_partials(function: str, old: tuple, new: tuple) -> tuple:
    if function in ("count", "sum", "avg"):
        return tuple(n if o is None else (o if n is None else o + n) for o, n in zip(old, new))
    pick = min if function == "min" else max
    return tuple(n if o is None else (o if n is None else pick(o, n)) for o, n in zip(old, new))


def final_value(function: str, partial: tuple) -> Any:
    if function == "avg":
        total, count = partial
        return None if not count else total / count
    return partial[0]


class WindowAggregate(_SparkStage):
    """Keyed event-time windows that fire once: when end + allowed lateness <= the key group's watermark.

    Watermarks and timers are kept per key group: a key group taken over from another instance resumes
    at its own streams' progress, which may lag this instance's other key groups.
    """

    spec: WindowAggregateStage

    def __init__(self, spec: WindowAggregateStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store)
        self._max_parallelism = max_parallelism
        self._widths = [len(_PARTIALS[a.function]) for a in spec.aggregations]
        self._steps = spec.window.size_ms // spec.window.step_ms  # windows per record
        self._timers: dict[int, dict[int, set[Any]]] = defaultdict(lambda: defaultdict(set))  # kg -> start -> keys
        self._watermarks: dict[int, int] = {}

    def restore(self, watermarks: dict[int, int] | None = None) -> None:
        for kg in self.store.key_groups:
            self.acquire(kg, (watermarks or {}).get(kg, MIN_WATERMARK))

    def acquire(self, kg: int, watermark: int = MIN_WATERMARK) -> None:
        """Timers from the key group's state; `watermark`: its committed input watermark, which every
        window fired before (a late record after a restart or handover must not open such a window again)."""
        for (key, ws), _ in self.store.items(kg):
            self._timers[kg][ws].add(key)
        self._watermarks[kg] = watermark

    def release(self, kg: int) -> None:
        self._timers.pop(kg, None)
        self._watermarks.pop(kg, None)

    @property
    def _horizon(self) -> int:
        return self.spec.window.size_ms + self.spec.allowed_lateness_ms

    def _fired_before(self, kg: int) -> int:
        return self._watermarks.get(kg, MIN_WATERMARK)

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if batch.records:
            self._add(batch)
        for kg in self.store.key_groups:
            mark = watermark if watermark == MAX_WATERMARK else batch.watermarks.get(kg, watermark)
            self._watermarks[kg] = max(self._fired_before(kg), mark)
        out = self._fire()
        lateness = self.spec.allowed_lateness_ms
        out_watermark = watermark if watermark == MAX_WATERMARK else watermark - lateness
        return out, out_watermark

    def _add(self, batch) -> None:
        self._register_inputs(batch)
        partials = self.spark.sql(partial_sql(self.spec)).toArrow()
        if not partials.num_rows:
            return
        step = self.spec.window.step_ms
        keys = partials.column("k").to_pylist()
        starts = partials.column("ws").to_pylist()
        width = sum(self._widths)
        columns = [c.to_pylist() for c in partials.columns[2 : 2 + width]]
        lasts = [c.to_pylist() for c in partials.columns[2 + width :]]
        kgs = key_groups_of(partials.column("k"), self._max_parallelism).tolist()
        late = 0
        for row, (kg, key, ws) in enumerate(zip(kgs, keys, starts)):
            fired = self._fired_before(kg)
            # A late record is in every window it explodes into; all of them have fired (the query counts
            # rows after the stage's `where`, so filtered records are never late).
            late += sum(col[row] for j, col in enumerate(lasts) if ws + j * step + self._horizon <= fired)
            if ws + self._horizon <= fired:
                continue  # that window fired: what is left of late records is dropped
            values = [col[row] for col in columns]
            state_key = (key, ws)
            old = self.store.get(kg, state_key)
            merged, offset = [], 0
            for agg, w in zip(self.spec.aggregations, self._widths):
                fresh = tuple(values[offset : offset + w])
                merged.extend(fresh if old is None else merge_partials(agg.function, old[offset : offset + w], fresh))
                offset += w
            self.store.put(kg, state_key, tuple(merged))
            self._timers[kg][ws].add(key)
        self.late_records += late // self._steps

    def _fire(self) -> pa.Table | None:
        due = []
        for kg, timers in self._timers.items():
            fired = self._fired_before(kg)
            for ws in [ws for ws in timers if ws + self._horizon <= fired]:
                due.extend((ws, repr(key), kg, key) for key in timers.pop(ws))
        if not due:
            return None
        due.sort(key=lambda d: d[:2])
        size = self.spec.window.size_ms
        rows: dict[str, list] = {self.spec.key_by: [], "window_start": [], "window_end": []}
        for agg in self.spec.aggregations:
            rows[agg.as_] = []
        for ws, _, kg, key in due:
            partial = self.store.get(kg, (key, ws))
            self.store.delete(kg, (key, ws))
            rows[self.spec.key_by].append(key)
            rows["window_start"].append(ws)
            rows["window_end"].append(ws + size)
            offset = 0
            for agg, width in zip(self.spec.aggregations, self._widths):
                rows[agg.as_].append(final_value(agg.function, partial[offset : offset + width]))
                offset += width
        table = pa.table(rows)
        ends = table.column("window_end")
        # Results carry the window's last instant as event time and its end as the
        # time latency is measured from (event time to sink).
        return table.append_column("event_time", pc.subtract(ends, 1)).append_column("_ingest_ms", ends)


class Stateful(_SparkStage):
    """User function (batch DataFrame, state DataFrame) -> (output DataFrame, new state DataFrame).

    The state DataFrame has the key column and the stateSchema columns, one row
    per key of the batch that has state. A returned state row replaces the key's
    state; a row whose state columns are all null deletes it.
    """

    spec: StatefulStage

    def __init__(self, spec: StatefulStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store)
        self._fn = load_function(spec.function)
        self._max_parallelism = max_parallelism
        self._state_fields = self.spark.createDataFrame([], spec.state_schema).schema.fields

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        from pyspark.sql.types import StructType

        df = self._register_inputs(batch)
        key = self.spec.key_by
        key_column = pa.concat_arrays(
            [c for u in self.spec.inputs if batch.table(u) is not None for c in batch.table(u).column(key).chunks]
        )
        unique = pc.unique(key_column)
        kgs = key_groups_of(unique, self._max_parallelism).tolist()
        rows = []
        for kg, k in zip(kgs, unique.to_pylist()):
            value = self.store.get(kg, k)
            if value is not None:
                rows.append((k, *value))
        schema = StructType([df.schema[key], *self._state_fields])
        out, new_state = self._fn(df, self.spark.createDataFrame(rows, schema))
        # Both results before any state changes: a batch that fails leaves the state as it was.
        output = out.toArrow()
        updates = new_state.toArrow()
        names = [f.name for f in self._state_fields]
        state_keys = updates.column(key).to_pylist()
        values = list(zip(*(updates.column(n).to_pylist() for n in names))) if len(updates) else []
        for kg, k, value in zip(key_groups_of(updates.column(key), self._max_parallelism).tolist(), state_keys, values):
            if all(v is None for v in value):
                self.store.delete(kg, k)
            else:
                self.store.put(kg, k, tuple(value))
        return output, watermark


def make_stage(spec, store: KeyGroupStore, max_parallelism: int):
    if spec.type == "sql":
        return SqlStage(spec, store)
    if spec.type == "pyspark":
        return PySparkStage(spec, store)
    if spec.type == "window_aggregate":
        return WindowAggregate(spec, store, max_parallelism)
    return Stateful(spec, store, max_parallelism)
