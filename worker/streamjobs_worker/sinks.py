"""Sink operators. Output becomes visible only through the batch's commit.

The Redis sink adds its records in the commit's MULTI/EXEC. The Parquet sink
has Spark write a uniquely named directory first and lists it in the sink's
manifest in the commit: a reader takes only the manifest's directories, so a
batch replayed after a crash never shows twice. The console sink prints after
the commit (at-least-once on a terminal is what a person watching expects).
"""

from __future__ import annotations

import json
import os
import uuid

import pyarrow as pa
from streamjobs_core.plan import JobPlan

from . import spark
from .transaction import Transaction


def user_columns(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in table.column_names if c.startswith("_")])


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class RedisSink:
    def __init__(self, plan: JobPlan, op: str, instance: int) -> None:
        self._key = plan.keys.output_stream(op)
        self._maxlen = plan.spec.operator(op).max_length

    def write(self, table: pa.Table, txn: Transaction) -> None:
        table = user_columns(table)
        names = table.column_names
        for row in zip(*(table.column(n).to_pylist() for n in names)):
            fields = {n: _text(v) for n, v in zip(names, row) if v is not None}
            txn.xadd(self._key, fields, self._maxlen)


class ParquetSink:
    def __init__(self, plan: JobPlan, op: str, instance: int) -> None:
        spec = plan.spec.operator(op)
        self._manifest = plan.keys.manifest(op)
        self._dir = os.path.join(spec.path, plan.id, op)  # namespace/name: jobs of one name apart
        self._prefix = f"i{instance}"
        self._spark = spark.session()

    def write(self, table: pa.Table, txn: Transaction) -> None:
        target = os.path.join(self._dir, f"{self._prefix}-{uuid.uuid4().hex}")
        self._spark.createDataFrame(user_columns(table)).coalesce(1).write.parquet(target)
        txn.rpushes.append((self._manifest, target))


class ConsoleSink:
    def __init__(self, plan: JobPlan, op: str, instance: int) -> None:
        self._label = f"[{op}/{instance}]"

    def write(self, table: pa.Table, txn: Transaction) -> None:
        rows = user_columns(table).to_pylist()
        txn.after_commit.append(lambda: print(*(f"{self._label} {json.dumps(r, default=str)}" for r in rows), sep="\n", flush=True))


def make_sink(plan: JobPlan, op: str, instance: int):
    kind = plan.spec.operator(op).type
    return {"redis_stream": RedisSink, "parquet": ParquetSink, "console": ConsoleSink}[kind](plan, op, instance)
