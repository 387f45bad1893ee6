"""Per-key-group handover against a real redis-server: a marker splits a key group's stream between its
old and new owner, the release rides on the old owner's commit, whole workers hand over (the controller's
steps run against the in-memory store: tests/unit/test_rescale_controller.py)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from streamjobs_core import handover
from streamjobs_core.codec import encode
from streamjobs_core.exchange import Fenced, RedisExchange, RedisStreams, Transaction
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.keygroups import Assignment, Move
from streamjobs_worker.inputs import StreamInput
from streamjobs_worker.ports import Ports
from streamjobs_worker.transaction import Checkpoint
from streamjobs_worker.worker import Worker

from ..jobs.control import control_plan


def write(r, plan, kg: int, values: list[int], watermark: int) -> None:
    table = pa.table({"v": pa.array(values, pa.int64())})
    r.xadd(plan.keys.kg_stream("src", "agg", kg), encode(table, watermark, [(0, 11)]))


def values(batch) -> list[int]:
    table = batch.table("src")
    return [] if table is None else table.column("v").to_pylist()


def commit(jobs, instance: int, txn: Transaction) -> None:
    incarnation = jobs.new_incarnation("agg", instance)
    Checkpoint(RedisExchange(jobs.r, jobs), jobs.keys, "agg", instance, incarnation).commit(txn)


def test_the_marker_splits_a_key_group_between_its_old_and_its_new_owner(r, plan, jobs):
    write(r, plan, 3, [1, 2], 100)
    write(r, plan, 2, [10], 100)
    handover.start(jobs, plan, "agg", [Move(3, 0, 1)])
    write(r, plan, 3, [3, 4], 900)
    write(r, plan, 2, [11], 900)
    old = StreamInput(RedisStreams(r), jobs, plan, "agg", 0, handover.owned_by(jobs, plan, "agg", 0))
    old.restore()
    batch = old.read(0, count=100)
    assert sorted(values(batch)) == [1, 2, 10, 11]  # nothing after key group 3's marker
    assert old.handovers() == {3: 1}
    assert batch.watermarks[3] == 100 and batch.watermarks[2] == 900
    assert values(old.read(0, count=100)) == []  # a parked stream is not read again

    txn = Transaction()
    old.add_progress(txn)
    jobs.release_in(txn, "agg", {3: 1})  # what the worker adds to the commit of that batch
    commit(jobs, 0, txn)
    old.release(3)
    assert handover.owned_by(jobs, plan, "agg", 0) == (0, 1, 2, 4, 5)
    assert handover.moved_to(jobs, "agg", 1) == [3]

    new = StreamInput(RedisStreams(r), jobs, plan, "agg", 1, handover.owned_by(jobs, plan, "agg", 1))
    new.restore()
    handover.start(jobs, plan, "agg", [Move(3, 0, 1)])  # a resumed controller repeats the step
    batch = new.read(0, count=100)
    assert sorted(values(batch)) == [3, 4]  # exactly what followed the marker
    assert new.handovers() == {}  # the repeated marker names the new owner: not a handover
    assert batch.watermarks[3] == 900


def test_the_final_switch_keeps_the_generation_so_running_instances_go_on_committing(r, plan, jobs):
    txn = lambda: Transaction(xadds=[("sj:{ctl}:x", {"a": "1"}, None)])  # noqa: E731
    running = Checkpoint(RedisExchange(r, jobs), jobs.keys, "agg", 0, jobs.new_incarnation("agg", 0))
    running.commit(txn())
    release = Transaction()
    jobs.release_in(release, "agg", {3: 1})
    commit(jobs, 1, release)
    owners = jobs.assignment("agg").owners
    handover.finish(jobs, "agg", Assignment(2, owners))
    assert jobs.ownership("agg") == (Assignment(2, owners), {})
    running.commit(txn())  # same generation: not fenced
    jobs.write_assignment("agg", Assignment(3, owners))  # a revoking rescale
    with pytest.raises(Fenced, match="generation changed"):
        running.commit(txn())
    assert r.xlen("sj:{ctl}:x") == 2


def test_a_stream_committed_at_its_marker_stays_parked_after_a_restart(r, plan, jobs):
    """The old owner committed up to the marker but died before the key group's release: restarted, it
    must not read the new owner's records after the marker."""
    write(r, plan, 3, [1], 100)
    handover.start(jobs, plan, "agg", [Move(3, 0, 1)])
    write(r, plan, 3, [2], 900)
    before = StreamInput(RedisStreams(r), jobs, plan, "agg", 0, (3,))
    before.restore()
    assert values(before.read(0, count=100)) == [1]
    txn = Transaction()
    before.add_progress(txn)  # the offset is the marker; SIGKILL before the release
    commit(jobs, 0, txn)
    after = StreamInput(RedisStreams(r), jobs, plan, "agg", 0, (3,))
    after.restore()
    assert after.handovers() == {3: 1} and values(after.read(0, count=100)) == []


def put(r, plan, kg: int, values: list[int]) -> None:
    """Records into the sink's input stream of key group `kg`, counted as the upstream's commit counts them."""
    r.xadd(plan.keys.kg_stream("agg", "out", kg), encode(pa.table({"v": pa.array(values, pa.int64())}), 100,
                                                           [(0, 11)]))
    r.hincrby(plan.keys.produced("agg", "out"), str(kg), len(values))


def written(r, plan) -> list[int]:
    return sorted(int(f[b"v"]) for _, f in r.xrange(plan.keys.output_stream("out")))


def test_a_worker_hands_a_key_group_over_at_its_marker_and_stops_reporting_its_lag(r, plan, jobs):
    """Whole workers (the sink: no Spark): the old owner writes what precedes the marker, the new owner what
    follows it, and the old owner's /metrics no longer shows the key group's lag (its new owner's now)."""
    def lag_sample(worker: Worker, kg: int) -> float | None:
        return worker.metrics.registry.get_sample_value("streamjobs_kg_lag_records", {
            "job": "ctl", "operator": "out", "instance": str(worker.instance), "input": "agg", "key_group": str(kg)})

    put(r, plan, 3, [1, 2])
    old = Worker(Ports.over_redis(r, plan.id), plan, "out", 0)
    old.restore()
    old.step()
    assert lag_sample(old, 3) == 0 and lag_sample(old, 2) == 0
    assert handover.start(jobs, plan, "out", [Move(3, 0, 1)]) == []  # not backlogged: a marker
    put(r, plan, 3, [3])
    old.step()
    assert 3 not in old.owned and lag_sample(old, 3) is None and lag_sample(old, 2) == 0
    new = Worker(Ports.over_redis(r, plan.id), plan, "out", 1)
    new.restore()
    new.step()
    assert new.owned == (3,)
    assert written(r, plan) == [1, 2, 3]


def test_a_key_group_released_to_a_worker_while_it_starts_reaches_it_before_the_handover_ends(r, plan, jobs):
    """A scale-out's new instance reads who owns what as it starts, then warms Spark up; the old owner releases
    a key group to it meanwhile. Restored, the new instance does not say it took the key group before it did:
    the controller, which ends the handover once every key group is taken, would have ended it with nobody
    reading that key group. Then it takes it over from the release, and its records are written once."""
    put(r, plan, 3, [1, 2])
    old = Worker(Ports.over_redis(r, plan.id), plan, "out", 0)
    old.restore()
    old.step()
    new = Worker(Ports.over_redis(r, plan.id), plan, "out", 1)  # its pod started: nothing is its own yet
    assert new.owned == ()
    step = [Move(3, 0, 1)]
    handover.start(jobs, plan, "out", step)
    put(r, plan, 3, [3])
    old.step()  # released at the marker
    assert 3 not in old.owned

    def controller_ends_when_taken() -> bool:  # the rescale controller's poll
        if handover.completed(jobs, "out", step):
            owners = [1 if kg == 3 else owner for kg, owner in enumerate(jobs.assignment("out").owners)]
            handover.finish(jobs, "out", Assignment(2, owners))
            return True
        return False

    new.restore()
    assert not controller_ends_when_taken()
    new.step()
    assert new.owned == (3,) and controller_ends_when_taken()
    new.step()  # reads what follows the marker
    assert written(r, plan) == [1, 2, 3]


def test_a_backlogged_owner_releases_at_its_next_commit_and_the_backlog_moves_with_the_key_group(r):
    """A marker behind 20 queued entries would wait until the old owner read them all (a fresh worker reads
    one entry per stream, then doubles). Over markerMaxLagRecords the controller asks for a release at the
    old owner's next commit instead: the old owner writes what it read, the new owner the rest, once each."""
    plan = control_plan(markerMaxLagRecords=5)
    jobs = RedisJobStore(r, plan.name)
    jobs.deploy(plan)
    for i in range(1, 21):
        put(r, plan, 3, [i])
    old = Worker(Ports.over_redis(r, plan.id), plan, "out", 0)
    old.restore()
    old.step()
    assert handover.start(jobs, plan, "out", [Move(3, 0, 1)]) == [3]
    assert not any(b"h" in fields for _, fields in r.xrange(plan.keys.kg_stream("agg", "out", 3)))
    for _ in range(20):
        if 3 not in old.owned:
            break
        time.sleep(0.05)
        old.step()
    assert 3 not in old.owned and handover.moved_to(jobs, "out", 1) == [3]
    by_old = written(r, plan)
    new = Worker(Ports.over_redis(r, plan.id), plan, "out", 1)
    new.restore()
    for _ in range(20):
        new.step()
    assert new.owned == (3,) and 0 < len(by_old) < 20
    assert written(r, plan) == list(range(1, 21))
    assert handover.completed(jobs, "out", [Move(3, 0, 1)])
