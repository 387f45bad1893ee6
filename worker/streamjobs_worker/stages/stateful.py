"""A user function over the batch and the state of its keys, state a row per key."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core.keygroups import key_groups_of
from streamjobs_core.spec import StatefulStage
from streamjobs_core.statelog import state_layout

from .. import phases
from ..state import KG, KeyGroupStore, last_per_key, replace_rows
from .base import _SparkStage, collect_both, load_function

_LOCAL_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
_LOCAL_STATE_BYTES = 4 << 20


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
