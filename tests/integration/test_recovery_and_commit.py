"""Durable state and the atomic, fenced commit against a real redis-server."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from streamjobs.bench.rescale import BALLAST_ROW_BYTES, STAGE, ballast, bench_job, state_bytes
from streamjobs_core.exchange import Fenced, RedisExchange, Transaction
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.keygroups import Assignment
from streamjobs_core.layout import JobKeys
from streamjobs_core.plan import JobPlan
from streamjobs_core.spec import WindowAggregateStage
from streamjobs_core.watermarks import MAX_WATERMARK
from streamjobs_worker import recovery
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages.window import WindowAggregate
from streamjobs_worker.state import KG, KeyGroupStore, StateLayout, open_store, replace_rows
from streamjobs_worker.transaction import Checkpoint

from tests.integration.late import late_rows

KEYS = JobKeys("t")
KEYED = StateLayout(key="k")


def exchange(r) -> RedisExchange:
    return RedisExchange(r, RedisJobStore(r, "t"))


def checkpoint(r, instance=0):
    jobs = RedisJobStore(r, "t")
    return Checkpoint(RedisExchange(r, jobs), KEYS, "op", instance, jobs.new_incarnation("op", instance))


def commit_changes(cp, store):
    txn = Transaction()
    txn.changelog.update(store.drain_changes())
    return cp.commit(txn)


def keyed_store(kgs) -> KeyGroupStore:
    return KeyGroupStore(kgs, layout=KEYED)


def put(store: KeyGroupStore, kg: int, key: str, value: int) -> None:
    row = pa.table({"k": [key], "v": pa.array([value], pa.int64()), KG: pa.array([kg], pa.int64())})
    store.update(0, [kg], lambda current: (replace_rows(current, row, None, "k"), row, None))


def delete(store: KeyGroupStore, kg: int, key: str) -> None:
    gone = pa.table({"k": [key], KG: pa.array([kg], pa.int64())})
    store.update(0, [kg], lambda current: (replace_rows(current, None, gone, "k"), None, gone))


def state(store: KeyGroupStore, kg: int) -> dict:
    table = store.table(kg)
    return {} if table is None else dict(zip(table.column("k").to_pylist(), table.column("v").to_pylist()))


def test_restore_from_changelog_then_snapshot_then_tail(r):
    cp = checkpoint(r)
    store = keyed_store([0, 1])
    put(store, 0, "a", 1)
    put(store, 1, "b", 3)
    ids = commit_changes(cp, store)
    put(store, 0, "a", 5)
    delete(store, 1, "b")
    ids.update(commit_changes(cp, store))
    recovery.snapshot(r, KEYS, "op", store, ids, [0, 1])
    assert r.xlen(KEYS.changelog("op", 0)) == 0, "a snapshot trims the changelog it covers"
    put(store, 0, "c", 7)
    ids.update(commit_changes(cp, store))

    restored = keyed_store([0, 1])
    last = recovery.restore(exchange(r), KEYS, "op", restored)
    assert state(restored, 0) == {"a": 5, "c": 7}
    assert state(restored, 1) == {}
    assert last[0] == ids[0]


def test_a_restore_after_a_reset_skips_the_snapshot_before_it_whatever_its_layout(r):
    """A stage whose state a live change reset (--reset-state) may hold other columns since: a snapshot taken
    before the reset is never loaded into the new layout (here it lacks the new segment column)."""
    cp = checkpoint(r)
    store = keyed_store([0])
    put(store, 0, "a", 1)
    recovery.snapshot(r, KEYS, "op", store, commit_changes(cp, store), [0])
    store.reset()
    windows = StateLayout(key="k", segment="ws")
    store.bind(windows)
    row = pa.table({"k": ["b"], "ws": pa.array([1000], pa.int64()), KG: pa.array([0], pa.int64())})
    store.update(1000, [0], lambda current: (row, row, None))
    commit_changes(cp, store)

    restored = KeyGroupStore([0], layout=windows)
    recovery.restore(exchange(r), KEYS, "op", restored)
    assert restored.table(0).to_pylist() == [{"k": "b", "ws": 1000}]


def test_a_prestaged_store_tails_the_changelog_and_restore_applies_only_the_rest(r):
    cp = checkpoint(r)
    owner = keyed_store([0, 1])
    for i in range(50):
        put(owner, 0, f"k{i}", i)
    ids = commit_changes(cp, owner)
    recovery.snapshot(r, KEYS, "op", owner, ids, [0, 1])
    put(owner, 1, "x", 1)
    ids.update(commit_changes(cp, owner))

    standby, applied = keyed_store([0, 1]), {}
    assert recovery.catch_up(exchange(r), KEYS, "op", standby, applied, [0, 1]) == 1  # snapshot of 0 + one entry of 1
    assert len(state(standby, 0)) == 50
    put(owner, 0, "k0", 100)
    delete(owner, 1, "x")
    ids.update(commit_changes(cp, owner))
    assert recovery.catch_up(exchange(r), KEYS, "op", standby, applied, [0, 1]) == 2
    put(owner, 0, "late", 7)  # the old owner's last commit before the handover
    ids.update(commit_changes(cp, owner))

    last = recovery.restore(exchange(r), KEYS, "op", standby, since=applied)
    assert last == ids
    assert state(standby, 0) == state(owner, 0) and state(standby, 1) == {}


def test_catch_up_reloads_a_key_group_whose_snapshot_trimmed_entries_it_had_not_read(r):
    cp = checkpoint(r)
    owner = keyed_store([0])
    put(owner, 0, "a", 1)
    ids = commit_changes(cp, owner)
    standby, applied = keyed_store([0]), {}
    recovery.catch_up(exchange(r), KEYS, "op", standby, applied, [0])
    for i in range(3):  # changes the standby never read, then a snapshot that trims them away
        put(owner, 0, f"b{i}", i)
        ids.update(commit_changes(cp, owner))
    recovery.snapshot(r, KEYS, "op", owner, ids, [0])
    assert r.xlen(KEYS.changelog("op", 0)) == 0
    put(owner, 0, "c", 9)
    ids.update(commit_changes(cp, owner))

    recovery.catch_up(exchange(r), KEYS, "op", standby, applied, [0])
    assert state(standby, 0) == state(owner, 0)
    assert applied == ids


def test_catch_up_folds_many_entries_of_a_key_group_into_one_apply(r):
    cp = checkpoint(r)
    owner = keyed_store([0])
    ids = {}
    for i in range(30):  # the same keys rewritten, deleted and written again
        put(owner, 0, f"k{i % 4}", i)
        if i % 7 == 0:
            delete(owner, 0, "k1")
        ids.update(commit_changes(cp, owner))
    standby, applied = keyed_store([0]), {}
    assert recovery.catch_up(exchange(r), KEYS, "op", standby, applied, [0]) == 30
    assert state(standby, 0) == state(owner, 0) == {"k0": 28, "k1": 29, "k2": 26, "k3": 27}


# --- window state through Redis -------------------------------------------------------------

MAX_P = 12
WINDOW = WindowAggregateStage.model_validate({
    "name": "agg", "type": "window_aggregate", "inputs": ["src"], "keyBy": "k",
    "window": {"type": "tumbling", "sizeMs": 1000},
    "aggregations": [{"function": "count", "as": "n"}, {"function": "sum", "column": "v", "as": "total"}],
})


def window_batch(keys, values, times, watermark) -> InputBatch:
    table = pa.table({"k": keys, "v": pa.array(values, pa.int64()), "event_time": pa.array(times, pa.int64())})
    return InputBatch(tables={"src": [table]}, records=table.num_rows, watermarks=dict.fromkeys(range(MAX_P), watermark))


def fired(out: pa.Table | None) -> dict:
    if out is None:
        return {}
    return {(row["k"], row["window_start"]): (row["n"], row["total"]) for row in out.to_pylist()}


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_window_state_restored_from_redis_fires_once_and_keeps_late_records_out(r, spark, backend, tmp_path):
    cp = checkpoint(r)
    first = WindowAggregate(WINDOW, open_store(backend, range(MAX_P), str(tmp_path / "first")), MAX_P)
    first.restore()
    out, _ = first.process(window_batch(["a", "b", "a"], [1, 2, 3], [100, 200, 1100], 500), 500)
    ids = commit_changes(cp, first.store)
    recovery.snapshot(r, KEYS, "op", first.store, ids, range(MAX_P))
    out, _ = first.process(window_batch(["a", "c"], [10, 20], [1200, 2500], 1500), 1500)
    assert fired(out) == {("a", 0): (1, 1), ("b", 0): (1, 2)}
    ids.update(commit_changes(cp, first.store))  # the fired windows' cut, after the snapshot

    # Restarted: state from the snapshot and the changelog tail, watermarks as committed (1500).
    second = WindowAggregate(WINDOW, open_store(backend, range(MAX_P), str(tmp_path / "second")), MAX_P)
    assert recovery.restore(exchange(r), KEYS, "op", second.store) == ids
    second.restore(dict.fromkeys(range(MAX_P), 1500))
    out, _ = second.process(window_batch(["a", "b"], [100, 200], [900, 1300], 1500), 1500)
    assert out is None and [r["v"] for r, _ in late_rows(second)] == [100], "it must not reopen window [0, 1000)"
    out, _ = second.process(InputBatch(watermarks=dict.fromkeys(range(MAX_P), 3000)), 3000)
    assert fired(out) == {("a", 1000): (2, 13), ("b", 1000): (1, 200), ("c", 2000): (1, 20)}


def test_the_rescale_benchmarks_ballast_restores_and_never_fires(r, spark):
    plan = JobPlan(bench_job("ballast"), 0)
    ballast(0.5)(r, plan)
    key_groups = plan.key_groups(STAGE)
    assert state_bytes(r, plan.keys, list(range(key_groups))) >= 0.5e6
    spec = plan.spec.operator(STAGE)
    stage = WindowAggregate(spec, KeyGroupStore(range(key_groups)), key_groups)
    recovery.restore(exchange(r), plan.keys, STAGE, stage.store)
    stage.restore()
    before = {kg: stage.store.table(kg) for kg in range(key_groups)}
    assert all(pc.min(pc.binary_length(t.column("k"))).as_py() >= BALLAST_ROW_BYTES for t in before.values())
    batch = InputBatch(tables={"words": [pa.table({"word": ["w"], "event_time": pa.array([10], pa.int64())})]},
                       records=1)
    assert stage.process(batch, 500)[0] is None
    out, _ = stage.process(InputBatch(), MAX_WATERMARK)
    assert out.to_pydict()["word"] == ["w"], "only the real window fires"
    assert all(stage.store.table(kg).equals(before[kg]) for kg in range(key_groups))


def test_commit_is_atomic_and_fenced_by_a_newer_incarnation(r):
    old = checkpoint(r)
    txn = Transaction()
    txn.xadd("sj:{t}:x", {"a": "1"})
    old.commit(txn)
    checkpoint(r)  # the instance restarted elsewhere
    txn = Transaction()
    txn.xadd("sj:{t}:x", {"a": "2"})
    txn.hset("sj:{t}:h", {"f": "v"})
    with pytest.raises(Fenced):
        old.commit(txn)
    assert r.xlen("sj:{t}:x") == 1
    assert not r.exists("sj:{t}:h")


def test_commit_is_fenced_by_a_new_assignment_epoch(r):
    jobs = RedisJobStore(r, "t")
    jobs.write_assignment("op", Assignment(1, (0,)))
    cp = checkpoint(r)
    cp.commit(Transaction(xadds=[("sj:{t}:x", {"a": "1"}, None)]))
    jobs.write_assignment("op", Assignment(2, (0,)))  # a revoking rescale: a new generation
    with pytest.raises(Fenced):
        cp.commit(Transaction(xadds=[("sj:{t}:x", {"a": "2"}, None)]))
    assert r.xlen("sj:{t}:x") == 1


def _sink(r, monkeypatch, rows_per_call: int, max_length: int | None = None):
    from streamjobs_core.loading import parse_job
    from streamjobs_worker.sinks import RedisSink

    sink = {"name": "out", "type": "redis_stream", "inputs": ["src"]} | ({"maxLength": max_length} if max_length else {})
    plan = JobPlan(parse_job({"metadata": {"name": "t"}, "spec": {
        "sources": [{"name": "src", "type": "zipf"}], "sinks": [sink]}}), 0)
    monkeypatch.setattr(RedisSink, "ROWS_PER_CALL", rows_per_call)
    return RedisSink(plan, "out", 0), plan.keys.output_stream("out")


def test_the_redis_sink_adds_an_entry_per_record_in_order_its_nulls_left_out_in_the_commit(r, monkeypatch):
    sink, stream = _sink(r, monkeypatch, rows_per_call=3)  # several script calls in one commit
    table = pa.table({
        "word": ["a", None, "é", "d", "e", "f", "g"],
        "n": pa.array([1, 2, None, -4, 2**62, 6, 7], pa.int64()),
        "x": [0.5, 1e20, float("nan"), None, 2.0, 3.25, -0.0],
        "ok": [True, False, None, True, True, False, True],
        "nested": [{"a": 1}, None, {"a": None}, {"a": 4}, {"a": 5}, {"a": 6}, {"a": 7}],
        "_ingest_ms": pa.array([0] * 7, pa.int64()),  # internal: never a field
    })
    txn = Transaction()
    sink.write(table, txn)
    txn.hset("sj:{t}:h", {"f": "v"})
    checkpoint(r).commit(txn)
    got = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in r.xrange(stream)]
    assert got == [
        {"word": "a", "n": "1", "x": "0.5", "ok": "true", "nested": '{"a": 1}'},
        {"n": "2", "x": "1e+20", "ok": "false"},
        {"word": "é", "x": "NaN", "nested": '{"a": null}'},
        {"word": "d", "n": "-4", "ok": "true", "nested": '{"a": 4}'},
        {"word": "e", "n": str(2**62), "x": "2.0", "ok": "true", "nested": '{"a": 5}'},
        {"word": "f", "n": "6", "x": "3.25", "ok": "false", "nested": '{"a": 6}'},
        {"word": "g", "n": "7", "x": "-0.0", "ok": "true", "nested": '{"a": 7}'},
    ]
    assert r.hget("sj:{t}:h", "f") == b"v"


def test_the_redis_sink_trims_to_its_max_length_and_refuses_a_record_without_fields_before_the_commit(r, monkeypatch):
    import redis

    sink, stream = _sink(r, monkeypatch, rows_per_call=100, max_length=10)
    for _ in range(30):
        txn = Transaction()
        sink.write(pa.table({"v": pa.array(range(100), pa.int64())}), txn)
        checkpoint(r).commit(txn)
    assert 10 <= r.xlen(stream) < 3000  # approximate trimming: whole nodes go
    assert r.xrevrange(stream, count=1)[0][1] == {b"v": b"99"}
    txn = Transaction()
    with pytest.raises(redis.DataError, match="record 1 "):
        sink.write(pa.table({"v": pa.array([1, None], pa.int64())}), txn)
    assert not txn.rows
