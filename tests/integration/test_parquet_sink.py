"""The Parquet sink writes Arrow's Parquet of Spark's types: Spark reads back what it would have written itself."""

from __future__ import annotations

import datetime as dt
import decimal
import os

import pyarrow as pa
from streamjobs_core.exchange import Transaction
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_worker import spark as sessions
from streamjobs_worker.sinks import ParquetSink

UTC = dt.UTC


def plan_writing_to(path: str) -> JobPlan:
    job = parse_job({"metadata": {"name": "files", "namespace": "team-a"}, "spec": {
        "sources": [{"name": "words", "type": "zipf", "rate": {"recordsPerSecond": 10}}],
        "sinks": [{"name": "out", "type": "parquet", "inputs": ["words"], "path": path}],
    }})
    return JobPlan(job, 0)


def every_kind() -> pa.Table:
    """Columns of every kind a stage's result holds, nulls among them, and a bookkeeping column the sink drops."""
    return pa.table({
        "word": pa.array(["a", None, "ç€𝄞"], pa.large_string()),
        "n": pa.array([1, 2**62, None], pa.int64()),
        "small": pa.array([1, None, -3], pa.int32()),
        "ratio": pa.array([0.5, float("inf"), None]),
        "flag": pa.array([True, None, False]),
        "blob": pa.array([b"\x00\xff", None, b""]),
        "at": pa.array([dt.datetime(2026, 11, 28, 5, 21, 0, 123456, UTC), None, dt.datetime(1970, 1, 1, tzinfo=UTC)],
                       pa.timestamp("us", "UTC")),
        "at_ms": pa.array([0, 1_764_307_260_123, None], pa.timestamp("ms", "UTC")),
        "day": pa.array([dt.date(2026, 11, 28), None, dt.date(1, 1, 1)]),
        "price": pa.array([decimal.Decimal("12.34"), None, decimal.Decimal("-0.01")], pa.decimal128(10, 2)),
        "tags": pa.array([[1, 2], [], None], pa.list_(pa.int64())),
        "bidder": pa.array([{"id": 1, "name": "x"}, None, {"id": None, "name": "y"}],
                           pa.struct([("id", pa.int64()), ("name", pa.string())])),
        "extra": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
        "_ingest_ms": pa.array([1, 2, 3], pa.int64()),
    })


def test_spark_reads_back_the_rows_and_types_it_would_have_written(spark, tmp_path):
    plan = plan_writing_to(str(tmp_path))
    table = every_kind()
    txn = Transaction()
    ParquetSink(plan, "out", 0).write(table, txn)

    [(manifest, folder)] = txn.rpushes
    assert manifest == plan.keys.manifest("out")
    assert os.path.dirname(folder) == os.path.join(str(tmp_path), plan.id, "out")
    written = spark.read.parquet(folder)
    user = table.drop_columns(["_ingest_ms"])
    # The same frame the sink used to have Spark write: the bridge's, of the same types.
    expected = sessions.bridge(spark).frame(user)
    assert [(f.name, f.dataType) for f in written.schema.fields] == \
        [(f.name, f.dataType) for f in expected.schema.fields]
    assert written.collect() == expected.collect()


def test_each_batch_and_instance_writes_a_folder_of_its_own(spark, tmp_path):
    plan = plan_writing_to(f"file://{tmp_path}")
    txn = Transaction()
    for instance in (0, 0, 1):
        ParquetSink(plan, "out", instance).write(every_kind(), txn)
    folders = [folder for _, folder in txn.rpushes]
    assert len(set(folders)) == 3 and all(f.startswith(f"file://{tmp_path}/") for f in folders)
    assert [os.path.basename(f)[:2] for f in folders] == ["i0", "i0", "i1"]
    assert spark.read.parquet(*folders).count() == 9


def test_an_empty_batch_leaves_a_readable_file_of_its_schema(spark, tmp_path):
    txn = Transaction()
    ParquetSink(plan_writing_to(str(tmp_path)), "out", 0).write(every_kind().slice(0, 0), txn)
    [(_, folder)] = txn.rpushes
    written = spark.read.parquet(folder)
    assert written.count() == 0 and "bidder" in written.columns

