"""Sink operators. Output becomes visible only through the batch's commit.

The Redis sink adds its records in the commit's MULTI/EXEC. The Parquet sink
writes a uniquely named directory first and lists it in the sink's manifest in
the commit: a reader takes only the manifest's directories, so a
batch replayed after a crash never shows twice. The console sink prints after
the commit (at-least-once on a terminal is what a person watching expects).
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import redis
from streamjobs_core.exchange import RowEntries, Transaction
from streamjobs_core.plan import JobPlan

from . import spark


def user_columns(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in table.column_names if c.startswith("_")])


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _texts(column: pa.ChunkedArray) -> list[str | None]:
    """A column's values as entry fields: text as is, anything else as JSON (integers and booleans, whose
    JSON is Arrow's text for them, cast at once; null stays None)."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.to_pylist()
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return pc.cast(column, pa.string()).to_pylist()
    return [None if v is None else _text(v) for v in column.to_pylist()]


class RedisSink:
    """A stream entry per record, its non-null columns as fields."""

    ROWS_PER_CALL = 10_000  # records per script call: a few MB of arguments, a few ms of Redis at most

    def __init__(self, plan: JobPlan, op: str, instance: int) -> None:
        self._key = plan.keys.output_stream(op)
        self._maxlen = plan.spec.operator(op).max_length

    def write(self, table: pa.Table, txn: Transaction) -> None:
        table = user_columns(table)
        if not table.num_rows:
            return
        names = table.column_names
        empty = np.ones(table.num_rows, dtype=bool)
        for name in names:
            empty &= table.column(name).is_null().to_numpy(zero_copy_only=False)
        if empty.any():  # as XADD would refuse it; raised before the commit, which then never happens
            raise redis.DataError(f"XADD requires at least one field: record {int(np.argmax(empty))} of the "
                                  "batch the sink writes has no non-null column")
        columns = [_texts(table.column(n)) for n in names]
        for start in range(0, table.num_rows, self.ROWS_PER_CALL):
            txn.rows.append(RowEntries(self._key, names, [c[start:start + self.ROWS_PER_CALL] for c in columns],
                                       self._maxlen))


class ParquetSink:
    """A directory per batch holding one Parquet file of Spark's types, written by Arrow's Parquet writer: a
    Spark write job per batch (its scheduling, Hadoop's commit protocol and the rows through the JVM) cost ~8x
    the CPU of the query before it in NEXMark Q1, for no guarantee the manifest does not already give."""

    def __init__(self, plan: JobPlan, op: str, instance: int) -> None:
        spec = plan.spec.operator(op)
        self._manifest = plan.keys.manifest(op)
        self._dir = os.path.join(spec.path, plan.id, op)  # namespace/name: jobs of one name apart
        self._files, self._root = _filesystem(self._dir)
        self._prefix = f"i{instance}"

    def write(self, table: pa.Table, txn: Transaction) -> None:
        name = f"{self._prefix}-{uuid.uuid4().hex}"
        table = user_columns(table)
        table = table.cast(spark.spark_types(table.schema)[0])
        folder = f"{self._root}/{name}"
        self._files.create_dir(folder)
        pq.write_table(table, f"{folder}/part-00000.snappy.parquet", filesystem=self._files, compression="snappy")
        txn.rpushes.append((self._manifest, os.path.join(self._dir, name)))


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem a sink's path names (a local folder, or a URI Arrow opens: file://, s3://, gs://,
    hdfs://) and the path within it."""
    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return pafs.FileSystem.from_uri(path)


class ConsoleSink:
    def __init__(self, plan: JobPlan, op: str, instance: int) -> None:
        self._label = f"[{op}/{instance}]"

    def write(self, table: pa.Table, txn: Transaction) -> None:
        rows = user_columns(table).to_pylist()
        txn.after_commit.append(lambda: print(*(f"{self._label} {json.dumps(r, default=str)}" for r in rows), sep="\n", flush=True))


def make_sink(plan: JobPlan, op: str, instance: int):
    kind = plan.spec.operator(op).type
    return {"redis_stream": RedisSink, "parquet": ParquetSink, "console": ConsoleSink}[kind](plan, op, instance)
