"""Records a stage fails on go to the dead-letter list; the rest of the batch is processed (real Spark)."""

from __future__ import annotations

from contextlib import contextmanager

import pyarrow as pa
import pytest
from streamjobs_core.spec import PySparkStage, SqlStage, WindowAggregateStage
from streamjobs_core.watermarks import MAX_WATERMARK
from streamjobs_worker import poison, probes
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages import make_stage
from streamjobs_worker.state import KeyGroupStore


def batch(**columns) -> InputBatch:
    table = pa.table(columns)
    return InputBatch(tables={"src": [table]}, records=table.num_rows)


def sql_stage(query: str, inputs=("src",)):
    spec = SqlStage.model_validate({"name": "s", "type": "sql", "inputs": list(inputs), "query": query})
    return make_stage(spec, KeyGroupStore(range(12)), 12)


class Counted:
    """The stage, counting its calls."""

    def __init__(self, stage) -> None:
        self.stage, self.spec, self.spark, self.calls = stage, stage.spec, stage.spark, 0

    def process(self, batch, watermark):
        self.calls += 1
        return self.stage.process(batch, watermark)


@contextmanager
def jobs_of(spark, group: str):
    """The ids of the Spark jobs run inside the block."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    found: list[int] = []
    try:
        yield found
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        found.extend(context.statusTracker().getJobIdsForGroup(group))


def test_a_cast_spark_refuses_rejects_that_record_only(spark):
    stage = sql_stage("SELECT k, CAST(n AS INT) * 2 AS twice FROM input")
    output, _, rejected = poison.process(stage, batch(k=["a", "b", "c", "d"], n=["1", "x", "3", "4"]), 0)
    assert sorted(output.column("twice").to_pylist()) == [2, 6, 8]
    assert [(r.upstream, r.record) for r in rejected] == [("src", {"k": "b", "n": "x"})]
    assert rejected[0].error == "NumberFormatException: [CAST_INVALID_INPUT] CAST(n AS INT) raises on this record"


def test_records_sharing_a_bad_value_are_all_found_and_a_null_is_no_error(spark):
    stage = sql_stage("SELECT k, CAST(n AS INT) AS n FROM input")
    records = batch(k=["a", "b", "c", "d", "e", "f"], n=["1", "x", "x", None, "2", "x"])
    output, _, rejected = poison.process(stage, records, 0)
    assert [r.record["k"] for r in rejected] == ["b", "c", "f"]
    assert sorted(output.column("k").to_pylist()) == ["a", "d", "e"]


FARES = "SELECT ride_id, CAST(fare AS DOUBLE) * 1.1 AS with_tip FROM input"


def rides(batch_no: int, size: int = 500) -> tuple[InputBatch, set[int]]:
    """Rides with 1% unparsable fares (five a batch, in different places each batch)."""
    ids = range(batch_no * size, (batch_no + 1) * size)
    bad = {i for i in ids if (i * 7919 + batch_no) % 100 == 3}
    fares = [("n/a", "12,50", "", "ten", "1.2.3")[i % 5] if i in bad else f"{3 + i % 70}.{i % 100:02d}" for i in ids]
    table = pa.table({"ride_id": pa.array(ids, pa.int64()), "fare": fares})
    return InputBatch(tables={"src": [table]}, records=size, watermarks={0: batch_no}), bad


def test_a_stream_with_one_percent_bad_fares_dead_letters_exactly_those_for_one_spark_job_a_batch(spark):
    stage = Counted(sql_stage(FARES))
    jobs, calls, seen, dead, all_bad = [], [], [], [], set()
    for n in range(8):
        records, bad = rides(n)
        all_bad |= bad
        before = stage.calls
        with jobs_of(spark, f"poison-stream-{n}") as ids:
            output, watermark, rejected = poison.process(stage, records, n)
        jobs.append(len(ids))
        calls.append(stage.calls - before)
        assert watermark == n and len(bad) >= 3
        seen += output.column("ride_id").to_pylist()
        dead += [r.record["ride_id"] for r in rejected]
        assert all("CAST(fare AS DOUBLE)" in r.error for r in rejected)
    assert sorted(dead) == sorted(all_bad)
    assert sorted(seen) == [i for i in range(8 * 500) if i not in all_bad]  # each good ride once
    # The first batch fails, is probed (no job), runs without its bad rides, and confirms once that the
    # stage refuses what the probe set aside. Later batches are probed first and run once, their planned
    # query in place, without a job (jvm/LocalRun.java).
    assert jobs[0] <= 3 and jobs[1:] == [0] * 7
    assert calls[1:] == [2] * 7  # the run and the empty call that advances the watermark (no job)


def test_a_batch_too_large_for_a_local_relation_is_probed_by_a_spark_job_alike(spark, monkeypatch):
    monkeypatch.setattr(probes, "_LOCAL_RECORDS", 100)
    stage = sql_stage(FARES)
    for n in range(2):
        records, bad = rides(n)
        with jobs_of(spark, f"poison-large-{n}") as ids:
            output, _, rejected = poison.process(stage, records, n)
        assert sorted(r.record["ride_id"] for r in rejected) == sorted(bad)
        assert output.num_rows == 500 - len(bad)
    assert len(ids) == 1  # the probe's job; the run is in place (jvm/LocalRun.java)


def test_two_different_bad_expressions_are_each_found_by_a_probe(spark):
    stage = Counted(sql_stage("SELECT ride_id, CAST(fare AS DOUBLE) AS fare, 100 DIV seats AS per_seat FROM input"))
    ids = list(range(200))
    fares = ["oops" if i in (3, 50, 120) else "9.5" for i in ids]
    seats = [0 if i in (7, 50, 199) else 4 for i in ids]
    output, _, rejected = poison.process(stage, batch(ride_id=ids, fare=fares, seats=seats), 0)
    assert sorted(r.record["ride_id"] for r in rejected) == [3, 7, 50, 120, 199]
    assert sorted(output.column("ride_id").to_pylist()) == [i for i in ids if i not in (3, 7, 50, 120, 199)]
    assert any("DIV" in r.error for r in rejected) and any("CAST" in r.error for r in rejected)
    assert stage.calls <= 8  # halving would take ~2 x log2(200) runs for each of the five


def test_a_cast_some_records_skip_dead_letters_only_those_the_stage_fails_on(spark):
    stage = sql_stage("SELECT ride_id, CASE WHEN fare = 'n/a' THEN NULL ELSE CAST(fare AS DOUBLE) END AS fare "
                      "FROM input")
    ids = list(range(40))
    fares = ["n/a" if i % 10 == 1 else "zz" if i % 10 == 2 else "7.25" for i in ids]
    for _ in range(2):  # the second batch is probed before it runs
        output, _, rejected = poison.process(stage, batch(ride_id=ids, fare=fares), 0)
        assert sorted(r.record["ride_id"] for r in rejected) == [2, 12, 22, 32]
        assert sorted(output.column("ride_id").to_pylist()) == [i for i in ids if i % 10 != 2]


def test_a_query_over_one_input_leaves_the_other_input_s_records_alone(spark):
    stage = sql_stage("SELECT k, CAST(n AS INT) AS n FROM rides", inputs=("rides", "other"))
    records = InputBatch(tables={"rides": [pa.table({"k": ["a", "b", "c"], "n": ["1", "x", "3"]})],
                                 "other": [pa.table({"k": ["d", "e"], "n": ["y", "z"]})]}, records=5)
    output, _, rejected = poison.process(stage, records, 0)
    assert [(r.upstream, r.record["k"]) for r in rejected] == [("rides", "b")]
    assert sorted(output.column("k").to_pylist()) == ["a", "c"]


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
    assert "CAST(n AS INT)" in rejected[0].error
    assert sorted((r["k"], r["window_start"], r["c"]) for r in output.to_pylist()) == [("a", 0, 1), ("b", 0, 1)]
    output, _, _ = poison.process(stage, InputBatch(), MAX_WATERMARK)
    assert [(r["k"], r["window_start"], r["c"]) for r in output.to_pylist()] == [("a", 1000, 1)]


def test_a_batch_whose_every_record_fails_a_cast_dead_letters_every_record_in_few_runs(spark):
    """onError: dead_letter is a promise per record, also when no record of a batch takes the cast."""
    stage = Counted(sql_stage("SELECT k, CAST(k AS INT) AS n FROM input"))
    output, _, rejected = poison.process(stage, batch(k=[f"x{i}" for i in range(1500)]), 0)
    assert output is None and sorted(r.record["k"] for r in rejected) == sorted(f"x{i}" for i in range(1500))
    assert all("CAST" in r.error for r in rejected)
    assert stage.calls <= 4  # one probe of Spark's error finds them all: not a run per record


def test_a_query_spark_cannot_plan_fails_the_batch_at_once(spark):
    stage = Counted(sql_stage("SELECT k, no_such_column FROM input"))
    with pytest.raises(poison.BatchFailed, match="cannot plan the batch.*no_such_column"):
        poison.process(stage, batch(k=["a", "b", "c"]), 0)
    assert stage.calls == 1
