"""The verification of a run never calls a correct run wrong: a stateful stage whose output rows depend on
its batches (outputs: per_batch) is checked by its final state per key, and a wrong state is still found.

The job's workers run in-process against a real redis-server, stepped by hand over several batches.
"""

from __future__ import annotations

import decimal
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from streamjobs.oracle import spilled, verify
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_worker.ports import Ports
from streamjobs_worker.worker import Worker

ACCOUNTS = 9


def ledger(batch: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Per account and batch: records, their sum and the balance after them (rows that depend on the batch)."""
    sums = batch.groupBy("account").agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"))
    joined = sums.join(state, "account", "left")
    count = F.coalesce(F.col("count"), F.lit(0)) + F.col("n")
    balance = F.coalesce(F.col("balance"), F.lit(0)) + F.col("total")
    return (joined.select("account", "n", "total", balance.alias("balance")),
            joined.select("account", count.alias("count"), balance.alias("balance")))


def miscounting_ledger(batch: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
    """What a wrong job would keep: every record counted twice."""
    out, new = ledger(batch.unionByName(batch), state)
    return out, new


def job(function: str = "ledger"):
    return parse_job({"metadata": {"name": "ledger"}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "in", "type": "redis_stream", "schema": "account bigint, amount bigint"}],
        "stages": [{"name": "books", "type": "stateful", "inputs": ["in"], "keyBy": "account", "chain": False,
                    "function": f"tests.integration.test_verification:{function}",
                    "stateSchema": "count bigint, balance bigint"}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["books"]}],
    }})


def run_in_batches(r, plan: JobPlan, batches: int, per_batch: int) -> None:
    workers = [Worker(Ports.over_redis(r, plan.id), plan, op, 0) for op in plan.vertices]
    for worker in workers:
        worker.restore()
    stream = plan.keys.input_stream("in", 0)
    for b in range(batches):
        for i in range(per_batch):
            n = b * per_batch + i
            r.xadd(stream, {"account": n % ACCOUNTS, "amount": n})
        for _ in range(3):
            for worker in workers:
                worker.step()
    RedisJobStore(r, plan.name).request_stop()
    deadline = time.monotonic() + 30
    while r.scard(plan.keys.done("out")) < 1:
        assert time.monotonic() < deadline, "the job did not drain"
        for worker in workers:
            worker.step()


def test_a_per_batch_stateful_stage_is_verified_by_its_final_state_not_called_wrong(r, spark):
    plan = JobPlan(job(), int(time.time() * 1000))
    RedisJobStore(r, plan.name).deploy(plan)
    run_in_batches(r, plan, batches=5, per_batch=40)
    assert r.xlen(plan.keys.output_stream("out")) > ACCOUNTS  # a row per account and batch: not one run's rows

    verdict = verify(spark, Ports.over_redis(r, plan.id), plan)
    assert verdict["correct"] is True, verdict
    assert verdict["states"]["books"]["expected"] == ACCOUNTS and verdict["states"]["books"]["lost"] == 0
    assert verdict["sinks"]["out"]["checked"] is False and "outputs: per_batch" in verdict["sinks"]["out"]["reason"]

    wrong = JobPlan(job("miscounting_ledger"), plan.t0_ms)  # the oracle replays another function: states differ
    assert verify(spark, Ports.over_redis(r, wrong.id), wrong)["correct"] is False


def test_a_stateful_stage_declared_per_record_has_its_output_compared(r, spark):
    spec = job().model_dump(by_alias=True)
    spec["spec"]["stages"][0]["outputs"] = "per_record"
    plan = JobPlan(parse_job(spec), int(time.time() * 1000))
    RedisJobStore(r, plan.name).deploy(plan)
    run_in_batches(r, plan, batches=3, per_batch=30)
    verdict = verify(spark, Ports.over_redis(r, plan.id), plan)
    assert verdict["correct"] is False  # it said per_record, its rows depend on batches: the comparison sees it
    assert verdict["sinks"]["out"]["unexpected"] > 0 and "states" not in verdict


def test_a_spilled_input_reads_back_as_createDataFrame_gives_it(spark, tmp_path):
    """The oracle hands a run's input to Spark through Parquet: every type a source decodes reads back as the
    same rows and Spark types an in-memory hand-over gives, a column of only nulls included."""
    table = pa.table({
        "id": pa.array([1, 2, None], pa.int64()),
        "price": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-3.25")], pa.decimal128(9, 2)),
        "at": pa.array([0, 1_700_000_000_000_000, None], pa.timestamp("us", tz="UTC")),
        "day": pa.array([0, 19_000, None], pa.date32()),
        "name": pa.array(["a", None, "ü"], pa.large_string()),
        "tags": pa.array([["x"], [], None], pa.list_(pa.string())),
        "attrs": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int32())),
        "nested": pa.array([{"a": 1.5, "b": True}, None, {"a": None, "b": False}],
                           pa.struct([("a", pa.float64()), ("b", pa.bool_())])),
        "nothing": pa.nulls(3),
    })
    frame = spilled(spark, table, tmp_path / "in")
    direct = spark.createDataFrame(table)
    assert frame.schema == direct.schema
    assert sorted(map(repr, frame.collect())) == sorted(map(repr, direct.collect()))


def test_a_spilled_input_is_read_in_row_groups_not_at_once(spark, tmp_path):
    table = pa.table({"k": pa.array(np.arange(2_500_000) % 7), "v": pa.array(np.arange(2_500_000))})
    frame = spilled(spark, table, tmp_path / "in")
    assert pq.ParquetFile(tmp_path / "in").num_row_groups == 3
    sums = {row.k: row.s for row in frame.groupBy("k").agg(F.sum("v").alias("s")).collect()}
    assert sums == {k: int(np.arange(2_500_000)[np.arange(2_500_000) % 7 == k].sum()) for k in range(7)}
