"""Queries planned once and run again per batch (prepared.py, jvm/*.java) give what planning each batch anew gives."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from streamjobs_core.spec import SqlStage as SqlSpec
from streamjobs_core.spec import WindowAggregateStage
from streamjobs_worker import spark as worker_spark
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.prepared import PreparedQueries
from streamjobs_worker.stages import SqlStage
from streamjobs_worker.stages.window import WindowAggregate, partial_sql
from streamjobs_worker.state import KeyGroupStore


def batch_of(rng, n: int) -> dict[str, pa.Table]:
    words = np.array(["ab", "abc", "b", "", "Zed", "é"])
    x = pa.table({
        "i": pa.array(rng.integers(-5, 20, n), mask=rng.random(n) < 0.1),
        "s": pa.array(words[rng.integers(0, len(words), n)], mask=rng.random(n) < 0.1),
        "d": rng.normal(size=n),
        "tags": pa.array([list(words[rng.integers(0, 6, rng.integers(0, 3))]) for _ in range(n)],
                         pa.list_(pa.string())),
        "event_time": rng.integers(0, 10_000, n),
    })
    y = pa.table({"j": rng.integers(-5, 20, n // 2), "w": rng.integers(0, 100, n // 2)})
    return {"x": x, "y": y}


def planned_anew(spark, tables: dict[str, pa.Table], query: str) -> pa.Table:
    bridge = worker_spark.bridge(spark)
    for name, table in tables.items():
        bridge.frame(table).coalesce(1).createOrReplaceTempView(name)
    return bridge.table(spark.sql(query))


def registered(spark, query: str):
    """Plans as the stages do: each input one partition (a single partition needs no exchange to aggregate)."""
    def plan(frames):
        for name, frame in frames.items():
            frame.coalesce(1).createOrReplaceTempView(name)
        return spark.sql(query)
    return plan


def rows(table: pa.Table) -> list[str]:
    return sorted(map(repr, table.to_pylist()))


REUSED = [
    "SELECT i, upper(s) AS u, d * 2 AS d2 FROM x WHERE i > 3 AND s LIKE 'a%'",
    "SELECT s, count(*) AS n, sum(i) AS si, max(d) AS md, collect_list(i) AS l FROM x GROUP BY s",
    "SELECT i, s, row_number() OVER (PARTITION BY s ORDER BY d) AS r FROM x",
    "SELECT i, d FROM x ORDER BY d DESC LIMIT 7",
    "SELECT a.i, b.i AS bi FROM x a JOIN x b ON a.i < b.i - 10 WHERE a.d > 1.0",  # one slot read twice a run
    "SELECT i FROM x UNION ALL SELECT j FROM y",
    # joins and unions of single partitions need no exchange (spark.py: spark.sql.maxSinglePartitionBytes)
    "SELECT k, count(*) AS n FROM (SELECT i AS k FROM x UNION ALL SELECT j FROM y) GROUP BY k",
    "SELECT x.i, y.w FROM x LEFT JOIN y ON x.i = y.j",
    "SELECT x.i, x.s, y.w FROM x JOIN y ON x.i = y.j AND y.w BETWEEN x.event_time % 100 AND x.event_time % 100 + 30",
    "SELECT x.*, r.w FROM x LEFT JOIN (SELECT /*+ COALESCE(1) */ * FROM (SELECT * FROM y UNION ALL "
    "SELECT j, w + 1 FROM y)) r ON x.i = r.j WHERE r.w IS NULL OR r.w > 50",
    "SELECT DISTINCT s FROM x",
    "SELECT i, tag FROM x LATERAL VIEW explode(tags) t AS tag",
    "SELECT CASE WHEN i IS NULL THEN 'none' WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END AS kind, count(*) AS n "
    "FROM x GROUP BY 1",
    "SELECT i, d FROM x WHERE i IN (1, 2, 3) OR s IS NULL",
]


@pytest.mark.parametrize("query", REUSED)
def test_a_query_run_again_on_each_batch_equals_it_planned_per_batch(spark, query):
    assert worker_spark.has_helpers(spark), "the session loaded the helpers' jar (jvm_helpers.py)"
    rng = np.random.default_rng(7)
    prepared = PreparedQueries(spark)
    for size in (40, 1, 300, 0, 77):
        tables = batch_of(rng, size)
        key = (query, tuple((name, t.schema) for name, t in tables.items()))
        got = prepared.run(key, tables, registered(spark, query))
        assert prepared.why_not(key) is None
        assert rows(got) == rows(planned_anew(spark, tables, query))


KEPT_FROM_PLANNING = {
    "SELECT i, current_timestamp() AS now FROM x": "current_timestamp",
    "SELECT i, current_date() AS today FROM x": "current_date",
    "SELECT i, rand() AS r FROM x": "rand",
    "SELECT i, uuid() AS u FROM x": "uuid",
    "SELECT i FROM x WHERE i = (SELECT max(j) FROM y)": "subquery",
    "SELECT i FROM x WHERE i IN (SELECT j FROM y)": "",
    # an anti join is moved below its left side's coalesce, which leaves a partition of unknown keys
    "SELECT x.* FROM x LEFT ANTI JOIN y ON x.i = y.j": "Exchange",
    "SELECT i FROM x UNION ALL SELECT k FROM z": "reads what was there",
}


@pytest.mark.parametrize("query", KEPT_FROM_PLANNING)
def test_a_plan_that_keeps_what_its_first_run_or_its_planning_fixed_is_planned_per_batch(spark, query):
    """The current time, a seed, a subquery's value, an exchange's output or another relation's rows would be
    those of the first batch on every later one: such a query is not run again."""
    worker_spark.bridge(spark).frame(pa.table({"k": [1, 2]})).createOrReplaceTempView("z")
    tables = batch_of(np.random.default_rng(3), 20)
    prepared = PreparedQueries(spark)
    key = (query, "schemas")
    assert prepared.run(key, tables, registered(spark, query)) is None
    assert KEPT_FROM_PLANNING[query] in prepared.why_not(key)


def test_slots_hold_no_batch_after_a_run_even_one_that_failed(spark):
    helpers = spark._jvm.streamjobs.jvm.CurrentBatch
    before = set(helpers.slots())
    prepared = PreparedQueries(spark)
    query = "SELECT assert_true(i < 10) AS ok FROM x"
    key = (query, "schemas")
    assert prepared.run(key, {"x": pa.table({"i": [1, 2]})}, registered(spark, query)) is not None
    with pytest.raises(Exception, match="i < 10"):
        prepared.run(key, {"x": pa.table({"i": [1, 20]})}, registered(spark, query))
    assert set(helpers.slots()) == before
    assert prepared.run(key, {"x": pa.table({"i": [3]})}, registered(spark, query)).num_rows == 1


def test_a_planned_query_runs_in_place_without_a_job_and_leaves_no_task_memory(spark):
    """jvm/LocalRun.java: the batch's partition is computed on the calling thread in a task context of its own;
    what its sort and aggregation took of the executor's memory is given back when it ends."""
    query = ("SELECT s, count(*) AS n, collect_list(i) AS l FROM (SELECT * FROM x ORDER BY d) GROUP BY s "
             "ORDER BY n DESC, s")
    prepared = PreparedQueries(spark)
    local_run = spark._jvm.streamjobs.jvm.LocalRun
    context = spark.sparkContext
    rng = np.random.default_rng(11)
    for size in (500, 3, 0):
        tables = batch_of(rng, size)
        want = planned_anew(spark, tables, query)
        context.setJobGroup(f"in-place-{size}", "in-place")
        try:
            got = prepared.run((query, "schemas"), tables, registered(spark, query))
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
        assert got.to_pylist() == want.to_pylist()
        assert list(context.statusTracker().getJobIdsForGroup(f"in-place-{size}")) == []
        assert local_run.executionMemoryUsed() == 0
    assert prepared.why_not((query, "schemas")) is None


def stage_batch(table: pa.Table) -> InputBatch:
    return InputBatch(tables={"src": [table]}, records=table.num_rows)


def test_a_sql_stage_plans_once_per_input_schema_and_a_new_column_plans_again(spark):
    stage = SqlStage(SqlSpec.model_validate({"name": "q", "type": "sql", "inputs": ["src"],
                                             "query": "SELECT * FROM input WHERE i % 3 = 0"}), KeyGroupStore(range(1)))
    rng = np.random.default_rng(5)
    seen = []
    for step in range(6):
        table = pa.table({"i": rng.integers(0, 100, 50), "v": rng.normal(size=50)})
        if step >= 3:
            table = table.append_column("extra", pa.array([f"e{step}"] * 50))
        out, _ = stage.process(stage_batch(table), 0)
        seen.append(out.schema)
        assert rows(out) == rows(table.filter(pc.equal(pc.multiply(pc.divide(table["i"], 3), 3), table["i"])))
    assert seen[2].names == ["i", "v"] and seen[5].names == ["i", "v", "extra"]
    # the first batch of each schema learns its pushdown on a plan of its own; the next one plans to reuse
    assert len(stage._prepared._plans) == 2 and all(p.query is not None for p in stage._prepared._plans.values())


def test_a_window_stage_runs_its_partial_aggregation_planned_once(spark):
    spec = WindowAggregateStage.model_validate({
        "name": "w", "type": "window_aggregate", "inputs": ["src"], "keyBy": "k",
        "window": {"type": "sliding", "sizeMs": 2000, "slideMs": 500},
        "aggregations": [{"function": "count", "as": "n"}, {"function": "avg", "column": "v", "as": "a"}]})
    stage = WindowAggregate(spec, KeyGroupStore(range(4)), 4)
    rng = np.random.default_rng(9)
    for t in range(0, 10_000, 1000):
        table = pa.table({"k": rng.integers(0, 5, 100), "v": rng.normal(size=100),
                          "event_time": rng.integers(t, t + 1000, 100)})
        stage.process(stage_batch(table), t)
    assert [p.why_not for p in stage._prepared._plans.values()] == [None]
    assert partial_sql(spec) in next(iter(stage._prepared._plans))


def test_worker_threads_that_share_a_session_warm_it_up_at_once_without_freeing_each_others_batches(spark):
    from concurrent.futures import ThreadPoolExecutor

    assert worker_spark.has_helpers(spark)  # the warm-up that loads a slot runs only then
    with ThreadPoolExecutor(4) as pool:  # the in-process harness's workers, each warming the shared session up
        for done in [pool.submit(worker_spark._warm_up, spark) for _ in range(12)]:
            done.result()
