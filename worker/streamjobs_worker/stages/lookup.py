"""The lookup stage: each record joined with the row of a table whose key equals one of its columns.

The table is a Redis hash per row or a Parquet file, loaded into the worker's
SparkSession and joined by broadcast (it is small next to the stream, as
enrichment tables are). It is loaded when the worker starts and, with
`table.refreshMs`, again once older than that at a batch: a record is enriched
with the table as loaded when its batch ran. The oracle joins the whole input
with the table as it is when the run is verified, so a run verifies exactly
while its table does not change.
"""

from __future__ import annotations

import time

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from streamjobs_core.spec import LookupStage as LookupSpec

from .. import phases
from .base import _SparkStage, collect

_KEY = "_lookup_key"
_GLOB = str.maketrans({c: f"\\{c}" for c in "*?[]\\"})


def load_table(spark: SparkSession, r, spec: LookupSpec) -> DataFrame:
    """The table as it is now: its key column first, then its columns."""
    table = spec.table
    if table.parquet_path is not None:
        return spark.read.parquet(table.parquet_path)
    prefix = table.redis_key_prefix
    names = sorted(r.scan_iter(match=prefix.translate(_GLOB) + "*", count=1000))
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(name)
    rows = [{table.key: name.decode()[len(prefix):], **{f.decode(): v.decode() for f, v in fields.items()}}
            for name, fields in zip(names, pipe.execute())]
    # Hash fields are strings: typed by the declared schema, else kept as strings (every field seen).
    typed = [f for f in spark.createDataFrame([], table.schema_).schema.fields if f.name != table.key] \
        if table.schema_ else []
    fields = [f.name for f in typed] if typed else sorted({c for row in rows for c in row} - {table.key})
    columns = [table.key, *fields]
    text = pa.table({c: pa.array([row.get(c) for row in rows], pa.string()) for c in columns})
    df = spark.createDataFrame(text.to_pandas(), ", ".join(f"`{c}` string" for c in columns))
    return df.select(F.col(f"`{table.key}`"), *(F.col(f"`{f.name}`").cast(f.dataType) for f in typed)) if typed \
        else df


def lookup_join(stream: DataFrame, table: DataFrame, spec: LookupSpec) -> DataFrame:
    """The stream's records with the table's columns (spec.columns, default all but the key) added."""
    if spec.by not in stream.columns:
        raise ValueError(f"{spec.name}: input has no column '{spec.by}' (by); it has {', '.join(stream.columns)}")
    wanted = list(spec.columns or (c for c in table.columns if c != spec.table.key))
    missing = [c for c in wanted if c not in table.columns]
    if missing:
        raise ValueError(f"{spec.name}: the table has no column {', '.join(missing)} (columns)")
    clashes = [c for c in wanted if c in stream.columns]
    if clashes:
        raise ValueError(f"{spec.name}: table columns {', '.join(clashes)} clash with the input's; choose columns")
    key = F.col(f"`{spec.table.key}`").cast(stream.schema[spec.by].dataType).alias(_KEY)
    rows = F.broadcast(table.select(key, *(F.col(f"`{c}`") for c in wanted)))
    joined = stream.join(rows, stream[f"`{spec.by}`"] == rows[_KEY], spec.how)
    return joined.drop(_KEY)


class LookupStage(_SparkStage):
    spec: LookupSpec

    def __init__(self, spec: LookupSpec, store, r, clock=time.monotonic) -> None:
        super().__init__(spec, store)
        if r is None and spec.table.parquet_path is None:
            raise ValueError(f"its table is kept in Redis (table.redisKeyPrefix {spec.table.redis_key_prefix!r}) "
                             "and this job runs over memory: give it a parquetPath or run it over Redis")
        self._r = r
        self._clock = clock
        self._table: DataFrame | None = None
        self._loaded_at = 0.0

    def table(self) -> DataFrame:
        refresh = self.spec.table.refresh_ms
        if self._table is None or (refresh and self._clock() - self._loaded_at >= refresh / 1000):
            with phases.phase("state"):
                self._table = load_table(self.spark, self._r, self.spec).localCheckpoint()
            self._loaded_at = self._clock()
        return self._table

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        stream = self._register_inputs(batch)
        table = self.table()
        with phases.phase("plan"):
            joined = lookup_join(stream, table, self.spec)
        return collect(joined), watermark
