"""Records a stage fails on go to the dead-letter list; the rest of the batch is processed (real Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from streamjobs_core.generators import MAX_WATERMARK
from streamjobs_core.spec import PySparkStage, SqlStage, WindowAggregateStage
from streamjobs_worker import poison
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages import make_stage
from streamjobs_worker.state import KeyGroupStore


def batch(**columns) -> InputBatch:
    table = pa.table(columns)
    return InputBatch(tables={"src": [table]}, records=table.num_rows)


def test_a_cast_spark_refuses_rejects_that_record_only(spark):
    spec = SqlStage.model_validate({"name": "s", "type": "sql", "inputs": ["src"],
                                    "query": "SELECT k, CAST(n AS INT) * 2 AS twice FROM input"})
    stage = make_stage(spec, KeyGroupStore(range(12)), 12)
    output, _, rejected = poison.process(stage, batch(k=["a", "b", "c", "d"], n=["1", "x", "3", "4"]), 0)
    assert sorted(output.column("twice").to_pylist()) == [2, 6, 8]
    assert [r.record for r in rejected] == [{"k": "b", "n": "x"}]
    assert "CAST" in rejected[0].error.upper() or "x" in rejected[0].error


def test_a_python_udf_that_raises_rejects_that_record_with_its_error(spark):
    spec = PySparkStage.model_validate({"name": "p", "type": "pyspark", "inputs": ["src"],
                                        "function": "tests.jobs.udfs:cents"})
    stage = make_stage(spec, KeyGroupStore(range(12)), 12)
    output, _, rejected = poison.process(stage, batch(k=["a", "b", "c"], price=[1, 13, 2]), 0)
    assert sorted(output.column("cents").to_pylist()) == [100, 200]
    assert [(r.record, r.error.endswith("ValueError: unlucky price 13")) for r in rejected] == [
        ({"k": "b", "price": 13}, True)]


def test_windows_get_the_good_records_and_fire_once(spark):
    spec = WindowAggregateStage.model_validate({
        "name": "w", "type": "window_aggregate", "inputs": ["src"], "keyBy": "k",
        "window": {"type": "tumbling", "sizeMs": 1000}, "where": "CAST(n AS INT) >= 0",
        "aggregations": [{"function": "count", "as": "c"}]})
    stage = make_stage(spec, KeyGroupStore(range(12)), 12)
    stage.restore()
    records = batch(k=["a", "a", "b", "a"], n=["1", "oops", "2", "3"], event_time=[100, 200, 300, 1500])
    output, watermark, rejected = poison.process(stage, records, 1200)
    assert [r.record["n"] for r in rejected] == ["oops"] and watermark == 1200
    assert sorted((r["k"], r["window_start"], r["c"]) for r in output.to_pylist()) == [("a", 0, 1), ("b", 0, 1)]
    output, _, _ = poison.process(stage, InputBatch(), MAX_WATERMARK)
    assert [(r["k"], r["window_start"], r["c"]) for r in output.to_pylist()] == [("a", 1000, 1)]


def test_a_query_wrong_for_every_record_fails_the_batch(spark):
    spec = SqlStage.model_validate({"name": "s", "type": "sql", "inputs": ["src"],
                                    "query": "SELECT k, CAST(k AS INT) AS n FROM input"})
    stage = make_stage(spec, KeyGroupStore(range(12)), 12)
    with pytest.raises(poison.BatchFailed, match="all 3 records"):
        poison.process(stage, batch(k=["a", "b", "c"]), 0)
