"""The stateful stage on a real SparkSession: state handed to the user function and read back as Arrow."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from streamjobs_core.keygroups import key_groups_of
from streamjobs_core.spec import StatefulStage
from streamjobs_core.statelog import changelog_fields, read_changes
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages.base import collect_both
from streamjobs_worker.stages.stateful import Stateful, state_frame
from streamjobs_worker.state import KeyGroupStore, open_store

MAX_P = 12
STATE_SEEN: list[dict] = []  # the state DataFrame of every call, as {account: balance}


def running_balance(batch: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Each account's balance after the batch; a balance of zero closes the account (its state goes)."""
    seen = state.toArrow()
    STATE_SEEN.append(dict(zip(seen.column("account").to_pylist(), seen.column("balance").to_pylist())))
    sums = batch.groupBy("account").agg(F.sum("amount").alias("delta"))
    balances = sums.join(state, "account", "left").select(
        "account", (F.coalesce(F.col("balance"), F.lit(0)) + F.col("delta")).alias("balance"))
    closed = balances.withColumn("balance", F.when(F.col("balance") != 0, F.col("balance")))
    return balances, closed


def without_state_column(batch: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
    return batch, batch.select("account")


def twice(batch: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The same key returned twice: its last row wins."""
    first = batch.select("account", F.lit(1).alias("balance"))
    return batch, first.unionByName(batch.select("account", F.lit(2).alias("balance")))


def elsewhere(batch: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
    """State for a key the batch does not hold, of a key group this instance does not own."""
    return batch, batch.select(F.lit(STRANGER).cast("long").alias("account"), F.lit(1).alias("balance"))


def spec(function: str, state_schema: str = "balance long") -> StatefulStage:
    return StatefulStage.model_validate({
        "name": "bal", "type": "stateful", "inputs": ["src"], "keyBy": "account",
        "function": f"tests.integration.test_stateful_stage:{function}", "stateSchema": state_schema,
    })


def batch(accounts, amounts, account_type: pa.DataType | None = None) -> InputBatch:
    table = pa.table({"account": pa.array(accounts, account_type or pa.int64()), "amount": pa.array(amounts, pa.int64())})
    return InputBatch(tables={"src": [table]}, records=table.num_rows)


def balances(out: pa.Table) -> dict:
    return dict(zip(out.column("account").to_pylist(), out.column("balance").to_pylist()))


def state_of(store: KeyGroupStore) -> dict:
    tables = [store.table(kg) for kg in store.key_groups]
    return {k: v for t in tables if t is not None for k, v in zip(t.column("account").to_pylist(),
                                                                  t.column("balance").to_pylist())}


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_balances_run_on_across_batches_and_a_zero_balance_deletes_the_state(spark, backend, tmp_path):
    store = open_store(backend, range(MAX_P), str(tmp_path / "state"))
    stage = Stateful(spec("running_balance"), store, MAX_P)
    STATE_SEEN.clear()
    out, _ = stage.process(batch([1, 2, 1, 4], [10, 5, 7, 1]), 0)
    assert balances(out) == {1: 17, 2: 5, 4: 1}
    assert out.schema.field("balance").type == pa.int64()
    first = store.drain_changes()
    out, _ = stage.process(batch([2, 3, 4], [-5, 4, 2]), 0)
    assert balances(out) == {2: 0, 3: 4, 4: 3}
    assert STATE_SEEN == [{}, {2: 5, 4: 1}], "the state of the batch's keys, nothing else"
    assert state_of(store) == {1: 17, 3: 4, 4: 3}
    second = store.drain_changes()
    deleted = [kg for kg, changes in second.items() if changes.deletes is not None]
    assert deleted == [int(key_groups_of(pa.array([2]), MAX_P)[0])]

    replica = Stateful(spec("running_balance"), KeyGroupStore(range(MAX_P)), MAX_P)  # as a restore rebuilds it
    for changes in (first, second):
        for kg, entry in changes.items():
            replica.store.apply(kg, read_changes(changelog_fields(entry)))
    assert state_of(replica.store) == state_of(store)
    out, _ = replica.process(batch([1, 2], [3, 3]), 0)
    assert balances(out) == {1: 20, 2: 3}


def test_balances_split_again_under_another_max_parallelism_run_on(spark, split_again):
    """Accounts' balances committed in 12 key groups, split again over 20 (a restore under another
    maxParallelism): each account's balance is where the stage under 20 key groups looks for it."""
    stage = Stateful(spec("running_balance"), KeyGroupStore(range(MAX_P)), MAX_P)
    accounts = list(range(40))
    stage.process(batch(accounts, [a * 10 + 1 for a in accounts]), 0)
    again = Stateful(spec("running_balance"), split_again(spec("running_balance"), stage.store, 20), 20)
    assert state_of(again.store) == {a: a * 10 + 1 for a in accounts}
    out, _ = again.process(batch([0, 7, 39], [-1, 5, 1]), 0)
    assert balances(out) == {0: 0, 7: 76, 39: 392}


def test_state_keys_keep_the_key_columns_type(spark):
    stage = Stateful(spec("running_balance"), KeyGroupStore(range(MAX_P)), MAX_P)
    stage.process(batch([7, 8], [1, 2], pa.int32()), 0)
    out, _ = stage.process(batch([7], [5], pa.int32()), 0)
    assert balances(out) == {7: 6}
    assert {stage.store.table(kg).schema.field("account").type
            for kg in stage.store.key_groups if stage.store.table(kg) is not None} == {pa.int32()}


def test_a_key_returned_twice_keeps_its_last_row(spark):
    stage = Stateful(spec("twice"), KeyGroupStore(range(MAX_P)), MAX_P)
    stage.process(batch([1, 2], [0, 0]), 0)
    assert state_of(stage.store) == {1: 2, 2: 2}
    assert sum(c.upserts.num_rows for c in stage.store.drain_changes().values()) == 2


def test_a_new_state_without_its_columns_is_refused_and_changes_nothing(spark):
    stage = Stateful(spec("without_state_column"), KeyGroupStore(range(MAX_P)), MAX_P)
    with pytest.raises(ValueError, match="bal: the new state has no column 'balance'"):
        stage.process(batch([1], [1]), 0)
    assert state_of(stage.store) == {} and stage.store.drain_changes() == {}


def test_a_state_column_that_does_not_cast_is_named(spark):
    stage = Stateful(spec("running_balance", "balance struct<x: int>"), KeyGroupStore(range(MAX_P)), MAX_P)
    with pytest.raises(ValueError, match="new state column 'balance'"):
        stage._save(pa.table({"account": [1], "balance": pa.array([1], pa.int64())}),
                    pa.schema([("account", pa.int64()), ("balance", pa.struct([("x", pa.int32())]))]))


STRANGER = next(k for k in range(100) if int(key_groups_of(pa.array([k]), MAX_P)[0]) != 0)


def test_new_state_for_a_key_group_not_owned_names_the_key(spark):
    stage = Stateful(spec("elsewhere"), KeyGroupStore([0]), MAX_P)
    mine = next(k for k in range(100) if int(key_groups_of(pa.array([k]), MAX_P)[0]) == 0)
    with pytest.raises(ValueError, match=f"new state for key {STRANGER}, of key group"):
        stage.process(batch([mine], [1]), 0)


def test_output_and_state_come_back_from_one_spark_job_as_they_would_alone(spark):
    left = spark.sql("SELECT 1 AS a, 'x' AS `b.c`, named_struct('n', 1, 'm', CAST(NULL AS STRING)) AS s, "
                     "TIMESTAMP '2024-01-01 00:00:00' AS t UNION ALL SELECT 2, NULL, named_struct('n', 2, 'm', 'y'), NULL")
    empty = spark.sql("SELECT CAST(7 AS INT) AS k WHERE false")
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    a, b = collect_both(left, empty)
    assert len(set(tracker.getJobIdsForGroup()) - before) == 1
    assert a.to_pylist() == left.toArrow().to_pylist() and a.schema.types == left.toArrow().schema.types
    assert b.num_rows == 0 and b.schema.names == ["k"] and b.schema.types == [pa.int32()]
    twice = spark.sql("SELECT 1 AS x, 2 AS x")  # one name twice: no struct, collected alone
    a, b = collect_both(twice, left)
    assert a.to_pylist() == [{"x": 2}] and b.to_pylist() == left.toArrow().to_pylist()


def test_small_state_goes_to_spark_as_a_local_relation_large_state_stays_columnar(spark):
    threshold = "spark.sql.execution.arrow.localRelationThreshold"
    schema = spark.createDataFrame([], "account long, balance long").schema
    chunks = pa.concat_tables([pa.table({"account": [i], "balance": [i]}) for i in range(5)])
    small = state_frame(spark, chunks, schema)
    assert "LocalTableScan" in small._jdf.queryExecution().executedPlan().toString()
    # Not a partition per chunk (five here): what the session's task threads split it into (one in a worker).
    assert small.rdd.getNumPartitions() <= spark.sparkContext.defaultParallelism < 5
    assert sorted(small.toArrow().column("account").to_pylist()) == [0, 1, 2, 3, 4]
    assert spark.conf.get(threshold) == "0", "the worker's setting is back"
    n = 300_000  # 4.8 MB: over the local-relation bound
    large = state_frame(spark, pa.table({"account": pa.array(range(n), pa.int64()),
                                         "balance": pa.array(range(n), pa.int64())}), schema)
    assert "LocalTableScan" not in large._jdf.queryExecution().executedPlan().toString()
    assert large.count() == n
