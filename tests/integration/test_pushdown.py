"""Filter pushdown into a stage's input (pushdown.py): whatever the condition, a stage's result with its input
cut first equals Spark's over the whole input, nulls, NaN and times included; and simple conditions are cut."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
from streamjobs_core.spec import SqlStage as SqlSpec
from streamjobs_core.spec import WindowAggregateStage
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages.sql import SqlStage
from streamjobs_worker.stages.window import WindowAggregate
from streamjobs_worker.state import KeyGroupStore

NAN = float("nan")
TABLE = pa.table({
    "i": pa.array([1, 2, 3, None, 3, 5], pa.int64()),
    "small": pa.array([1, 2, 3, 4, 5, 6], pa.int16()),
    "s": pa.array(["ab", "xb", None, "abc", "y", "x"]),
    "b": pa.array([True, False, None, True, False, True]),
    "d": pa.array([1.5, NAN, None, 2.0, -1.0, NAN]),
    "t": pa.array([datetime.datetime(2025, 6, 1), None, datetime.datetime(2026, 6, 1)] * 2,
                  pa.timestamp("us", tz="UTC")),
    "event_time": pa.array([1000, 2000, 3000, 4000, 5000, 6000], pa.int64()),
})
CONDITIONS = [
    "i = 3", "i > 2 AND s = 'y'", "NOT (i IN (1, 2))", "i IN (1, NULL)", "NOT (i IN (1, NULL))", "small < 3",
    "s LIKE 'ab%'", "s LIKE '%b'", "s LIKE '%b%'", "NOT s LIKE 'a%'", "s >= 'x'", "d > 1.0", "NOT d = 2.0",
    "d = 'NaN'", "i IS NULL OR s = 'y'", "NOT (s IS NOT NULL AND i > 1)", "b", "NOT b", "b = false",
    "t > TIMESTAMP '2026-01-01 00:00:00'", "i + 1 = 3", "i = 3 OR d > 0", "coalesce(i, 0) = 0",
    "i = 3 AND rand(7) < 2", "NOT (i = 1 AND s = 'zz')", "i <=> NULL", "i BETWEEN 2 AND 4",
]


def sql_stage(query: str) -> SqlStage:
    return SqlStage(SqlSpec.model_validate({"name": "q", "type": "sql", "inputs": ["src"], "query": query}),
                    KeyGroupStore(range(1)))


def rows(table: pa.Table | None) -> list[str]:
    return sorted(map(repr, table.to_pylist())) if table is not None else []


def one_batch() -> InputBatch:
    return InputBatch(tables={"src": [TABLE]}, records=TABLE.num_rows)


@pytest.mark.parametrize("condition", CONDITIONS)
def test_a_stage_whose_input_is_cut_first_gives_what_spark_gives_over_all_of_it(spark, condition):
    want = rows(spark.createDataFrame(TABLE).where(condition).toArrow())
    stage = sql_stage(f"SELECT * FROM input WHERE {condition}")
    first, _ = stage.process(one_batch(), 0)  # its plan says what the next batches may cut
    second, _ = stage.process(one_batch(), 0)
    assert rows(first) == want and rows(second) == want


def test_simple_conditions_cut_the_input_and_others_leave_it_whole(spark):
    def cut(query: str) -> int:
        stage = sql_stage(query)
        stage.process(one_batch(), 0)
        (pushed,) = stage._pushed.values()
        return TABLE.num_rows if pushed is None else TABLE.filter(pushed).num_rows

    assert cut("SELECT i FROM input WHERE i = 3 AND s = 'y'") == 1
    assert cut("SELECT i FROM input WHERE s LIKE 'ab%' AND coalesce(i, 0) + 1 = 2") == 2  # the part that translates
    assert cut("SELECT i FROM input WHERE d > 1.0") == 5  # only "d is not null": NaN sorts otherwise in Arrow
    assert cut("SELECT i FROM input WHERE NOT (i = 1 AND i + 1 = 2)") == 6  # a NOT of a part would drop rows
    # the input read twice: one side's filter must not cut the rows the other reads
    assert cut("SELECT a.i FROM input a JOIN input b ON a.i < b.i WHERE a.i = 3") == 6
    stage = sql_stage("SELECT a.i, b.i AS j FROM input a JOIN input b ON a.i < b.i WHERE a.i = 3")
    stage.process(one_batch(), 0)
    assert rows(stage.process(one_batch(), 0)[0]) == [repr({"i": 3, "j": 5})] * 2


def test_a_window_stage_cuts_its_input_by_its_where(spark):
    spec = WindowAggregateStage.model_validate({
        "name": "w", "type": "window_aggregate", "inputs": ["src"], "keyBy": "s", "where": "small >= 4",
        "window": {"sizeMs": 10_000}, "aggregations": [{"function": "count", "as": "n"}]})
    stage = WindowAggregate(spec, KeyGroupStore(range(4)), 4)
    stage.process(one_batch(), 0)
    stage.process(one_batch(), 0)
    (pushed,) = stage._pushed.values()
    assert TABLE.filter(pushed).num_rows == 3
    out, _ = stage.process(InputBatch(tables={}, records=0), 2**62)
    assert sorted((r["s"], r["n"]) for r in out.to_pylist()) == [("abc", 2), ("x", 2), ("y", 2)]
