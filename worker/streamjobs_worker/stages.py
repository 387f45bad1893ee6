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

    def restore(self) -> None:
        """Stateless stages have nothing to rebuild."""


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


def partial_sql(spec: WindowAggregateStage, late_before: int) -> str:
    """Per (key, window start) partial aggregates of the batch, and per group how many of its rows come
    from late records: records whose last window has fired already (with `late_before`)."""
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
    late = f"sum(CASE WHEN {last} + {size + spec.allowed_lateness_ms} <= {late_before} THEN 1 ELSE 0 END) AS _late"
    return f"SELECT `{spec.key_by}` AS k, ws, {', '.join(parts)}, {late} FROM {source} GROUP BY `{spec.key_by}`, ws"


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
    """Keyed event-time windows that fire once: when end + allowed lateness <= watermark."""

    spec: WindowAggregateStage

    def __init__(self, spec: WindowAggregateStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store)
        self._max_parallelism = max_parallelism
        self._widths = [len(_PARTIALS[a.function]) for a in spec.aggregations]
        self._timers: dict[int, set[tuple[int, Any]]] = defaultdict(set)
        self._watermark = -(2**63)

    def restore(self) -> None:
        for kg in self.store.key_groups:
            for (key, ws), _ in self.store.items(kg):
                self._timers[ws].add((kg, key))

    @property
    def _horizon(self) -> int:
        return self.spec.window.size_ms + self.spec.allowed_lateness_ms

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if batch.records:
            self._add(batch)
        self._watermark = max(self._watermark, watermark)
        out = self._fire()
        lateness = self.spec.allowed_lateness_ms
        out_watermark = watermark if watermark == MAX_WATERMARK else watermark - lateness
        return out, out_watermark

    def _add(self, batch) -> None:
        self._register_inputs(batch)
        partials = self.spark.sql(partial_sql(self.spec, self._watermark)).toArrow()
        if not partials.num_rows:
            return
        # A late record is in every window it explodes into; all of them have fired (the query counts
        # rows after the stage's `where`, so filtered records are never late).
        size, step = self.spec.window.size_ms, self.spec.window.step_ms
        self.late_records += sum(partials.column("_late").to_pylist()) // (size // step)
        keys = partials.column("k").to_pylist()
        starts = partials.column("ws").to_pylist()
        columns = [c.to_pylist() for c in partials.columns[2:-1]]
        kgs = key_groups_of(partials.column("k"), self._max_parallelism).tolist()
        for row, (kg, key, ws) in enumerate(zip(kgs, keys, starts)):
            if ws + self._horizon <= self._watermark:
                continue  # that window fired: what is left of late records is dropped
            values = [col[row] for col in columns]
            state_key = (key, ws)
            old = self.store.get(kg, state_key)
            merged, offset = [], 0
            for agg, width in zip(self.spec.aggregations, self._widths):
                fresh = tuple(values[offset : offset + width])
                merged.extend(fresh if old is None else merge_partials(agg.function, old[offset : offset + width], fresh))
                offset += width
            self.store.put(kg, state_key, tuple(merged))
            self._timers[ws].add((kg, key))

    def _fire(self) -> pa.Table | None:
        due = sorted(ws for ws in self._timers if ws + self._horizon <= self._watermark)
        if not due:
            return None
        size = self.spec.window.size_ms
        rows: dict[str, list] = {self.spec.key_by: [], "window_start": [], "window_end": []}
        for agg in self.spec.aggregations:
            rows[agg.as_] = []
        for ws in due:
            for kg, key in sorted(self._timers.pop(ws), key=repr):
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
        updates = new_state.toArrow()
        names = [f.name for f in self._state_fields]
        state_keys = updates.column(key).to_pylist()
        values = list(zip(*(updates.column(n).to_pylist() for n in names))) if len(updates) else []
        for kg, k, value in zip(key_groups_of(updates.column(key), self._max_parallelism).tolist(), state_keys, values):
            if all(v is None for v in value):
                self.store.delete(kg, k)
            else:
                self.store.put(kg, k, tuple(value))
        return out.toArrow(), watermark


def make_stage(spec, store: KeyGroupStore, max_parallelism: int):
    if spec.type == "sql":
        return SqlStage(spec, store)
    if spec.type == "pyspark":
        return PySparkStage(spec, store)
    if spec.type == "window_aggregate":
        return WindowAggregate(spec, store, max_parallelism)
    return Stateful(spec, store, max_parallelism)
