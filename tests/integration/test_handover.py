"""Per-key-group handover against a real redis-server: a marker splits a key group's stream between its
old and new owner, the release rides on the old owner's commit, and the fluid/batched controller steps."""

from __future__ import annotations

import time

import msgpack
import pyarrow as pa
import pytest
from streamjobs_core import handover
from streamjobs_core.codec import decode, encode
from streamjobs_core.keygroups import Assignment, Move
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan, read_assignment, write_assignment
from streamjobs_core.rescale import HANDOVER, RescaleController, progress
from streamjobs_worker.inputs import StreamInput
from streamjobs_worker.transaction import Checkpoint, Fenced, Transaction
from streamjobs_worker.worker import Worker

from .conftest import JOB


def write(r, plan, kg: int, values: list[int], watermark: int) -> None:
    table = pa.table({"v": pa.array(values, pa.int64())})
    r.xadd(plan.keys.kg_stream("src", "agg", kg), encode(table, watermark, [(0, 11)]))


def values(batch) -> list[int]:
    table = batch.table("src")
    return [] if table is None else table.column("v").to_pylist()


def commit(r, plan, instance: int, txn: Transaction) -> None:
    incarnation = r.incr(plan.keys.incarnation("agg", instance))
    Checkpoint(r, plan.keys, "agg", instance, incarnation).commit(txn)


def test_the_marker_splits_a_key_group_between_its_old_and_its_new_owner(r, plan):
    keys = plan.keys
    write(r, plan, 3, [1, 2], 100)
    write(r, plan, 2, [10], 100)
    handover.start(r, plan, "agg", [Move(3, 0, 1)])
    write(r, plan, 3, [3, 4], 900)
    write(r, plan, 2, [11], 900)
    old = StreamInput(r, plan, "agg", 0, handover.owned_by(r, plan, "agg", 0))
    old.restore()
    batch = old.read(100, 0)
    assert sorted(values(batch)) == [1, 2, 10, 11]  # nothing after key group 3's marker
    assert old.handovers() == {3: 1}
    assert batch.watermarks[3] == 100 and batch.watermarks[2] == 900
    assert values(old.read(100, 0)) == []  # a parked stream is not read again

    txn = Transaction()
    old.add_progress(txn)
    txn.hset(keys.owners("agg"), {3: 1})  # what the worker adds to the commit of that batch
    commit(r, plan, 0, txn)
    old.release(3)
    assert handover.owned_by(r, plan, "agg", 0) == (0, 1, 2, 4, 5)
    assert handover.moved_to(r, plan, "agg", 1) == [3]

    new = StreamInput(r, plan, "agg", 1, handover.owned_by(r, plan, "agg", 1))
    new.restore()
    handover.start(r, plan, "agg", [Move(3, 0, 1)])  # a resumed controller repeats the step
    batch = new.read(100, 0)
    assert sorted(values(batch)) == [3, 4]  # exactly what followed the marker
    assert new.handovers() == {}  # the repeated marker names the new owner: not a handover
    assert batch.watermarks[3] == 900


def test_a_source_partition_is_asked_for_its_release_not_marked(r, plan):
    handover.start(r, plan, "src", [Move(0, 0, 1)])
    assert r.hgetall(plan.keys.releases("src")) == {b"0": b"1"}
    assert not r.keys(plan.keys.kg_stream("*", "src", 0))


def test_the_final_switch_keeps_the_generation_so_running_instances_go_on_committing(r, plan):
    txn = lambda: Transaction(xadds=[("sj:{ctl}:x", {"a": "1"}, None)])  # noqa: E731
    incarnation = r.incr(plan.keys.incarnation("agg", 0))
    running = Checkpoint(r, plan.keys, "agg", 0, incarnation)
    running.commit(txn())
    r.hset(plan.keys.owners("agg"), "3", 1)
    owners = read_assignment(r, plan.keys, "agg").owners
    handover.finish(r, plan, "agg", Assignment(2, owners))
    assert not r.exists(plan.keys.owners("agg"))
    running.commit(txn())  # same generation: not fenced
    write_assignment(r, plan.keys, "agg", Assignment(3, owners))  # a revoking rescale
    with pytest.raises(Fenced, match="generation"):
        running.commit(txn())
    assert r.xlen("sj:{ctl}:x") == 2


class Instances:
    """Stands in for the workers: each sleep of the controller, every marked key group is released and
    taken over the way workers record it. `die_after` sleeps, the controller 'dies' once."""

    def __init__(self, r, plan, die_after: int | None = None) -> None:
        self.r, self.plan, self.die_after = r, plan, die_after
        self.calls: list[tuple] = []
        self.sleeps = 0
        self.moved_so_far: list[int] = []  # what `streamjobs status` showed at each sleep

    def add_instances(self, op, parallelism):
        self.calls.append(("add_instances", op, parallelism))

    def remove_instances(self, op, parallelism):
        self.calls.append(("remove_instances", op, parallelism))

    def sleep(self, _seconds: float) -> None:
        self.sleeps += 1
        if self.die_after is not None and self.sleeps > self.die_after:
            self.die_after = None
            raise ConnectionError("controller died between steps")
        keys = self.plan.keys
        self.moved_so_far.append(progress(self.r, keys)["key_groups_moved"])
        for kg in range(12):
            for _, fields in self.r.xrange(keys.kg_stream("src", "agg", kg)):
                target = decode(fields).marker
                if target is not None:
                    self.r.hset(keys.owners("agg"), str(kg), target)
                    self.r.hset(keys.acquired("agg"), str(kg), target)


def markers(r, plan) -> dict[int, int]:
    keys = plan.keys
    found = {kg: sum(b"h" in f for _, f in r.xrange(keys.kg_stream("src", "agg", kg))) for kg in range(12)}
    return {kg: n for kg, n in found.items() if n}


def test_fluid_moves_one_key_group_per_step_then_switches_in_the_same_generation(r, plan):
    fleet = Instances(r, plan)
    record = RescaleController(r, plan, fleet, sleep=fleet.sleep).rescale("agg", 3, "fluid")
    assignment = read_assignment(r, plan.keys, "agg")
    assert (assignment.epoch, assignment.parallelism) == (2, 3)
    assert r.hget(plan.keys.assignment("agg"), "generation") == b"1"
    assert record["moved_key_groups"] == record["steps"] == 6  # 4, 5 -> 1; 8..11 -> 2
    assert markers(r, plan) == {4: 1, 5: 1, 8: 1, 9: 1, 10: 1, 11: 1}
    assert fleet.calls == [("add_instances", "agg", 3), ("remove_instances", "agg", 3)]
    assert fleet.moved_so_far == list(range(6))
    assert not r.exists(plan.keys.owners("agg"), plan.keys.acquired("agg"), plan.keys.rescale_current)


def test_batched_scale_in_resumed_after_the_controller_died_mid_steps(r, plan):
    first = Instances(r, plan)
    RescaleController(r, plan, first, sleep=first.sleep).rescale("agg", 4, "fluid")
    r.delete(*[plan.keys.kg_stream("src", "agg", kg) for kg in range(12)])
    dying = Instances(r, plan, die_after=1)
    with pytest.raises(ConnectionError):
        RescaleController(r, plan, dying, sleep=dying.sleep).rescale("agg", 2, "batched")
    assert RescaleController(r, plan, dying).current()["phase"] == HANDOVER
    fleet = Instances(r, plan)
    record = RescaleController(r, plan, fleet, sleep=fleet.sleep).resume()
    assert (record["from"], record["to"], record["moved_key_groups"], record["steps"]) == (4, 2, 9, 2)
    assert read_assignment(r, plan.keys, "agg").owners == (0,) * 6 + (1,) * 6
    assert fleet.calls == [("remove_instances", "agg", 2)]
    assert all(n <= 2 for n in markers(r, plan).values())  # a step already done is not marked again


def test_a_stream_committed_at_its_marker_stays_parked_after_a_restart(r, plan):
    """The old owner committed up to the marker but died before the key group's release: restarted, it
    must not read the new owner's records after the marker."""
    write(r, plan, 3, [1], 100)
    handover.start(r, plan, "agg", [Move(3, 0, 1)])
    write(r, plan, 3, [2], 900)
    before = StreamInput(r, plan, "agg", 0, (3,))
    before.restore()
    assert values(before.read(100, 0)) == [1]
    txn = Transaction()
    before.add_progress(txn)  # the offset is the marker; SIGKILL before the release
    commit(r, plan, 0, txn)
    after = StreamInput(r, plan, "agg", 0, (3,))
    after.restore()
    assert after.handovers() == {3: 1} and values(after.read(100, 0)) == []


def put(r, plan, kg: int, values: list[int]) -> None:
    """Records into the sink's input stream of key group `kg`, counted as the upstream's commit counts them."""
    r.xadd(plan.keys.kg_stream("agg", "out", kg), encode(pa.table({"v": pa.array(values, pa.int64())}), 100,
                                                           [(0, 11)]))
    r.hincrby(plan.keys.produced("agg", "out"), str(kg), len(values))


def written(r, plan) -> list[int]:
    return sorted(int(f[b"v"]) for _, f in r.xrange(plan.keys.output_stream("out")))


def test_a_worker_hands_a_key_group_over_at_its_marker_and_stops_reporting_its_lag(r, plan):
    """Whole workers (the sink: no Spark): the old owner writes what precedes the marker, the new owner what
    follows it, and the old owner's /metrics no longer shows the key group's lag (its new owner's now)."""
    def lag_sample(worker: Worker, kg: int) -> float | None:
        return worker.metrics.registry.get_sample_value("streamjobs_kg_lag_records", {
            "job": "ctl", "operator": "out", "instance": str(worker.instance), "input": "agg", "key_group": str(kg)})

    put(r, plan, 3, [1, 2])
    old = Worker(r, plan, "out", 0)
    old.restore()
    old.step()
    assert lag_sample(old, 3) == 0 and lag_sample(old, 2) == 0
    assert handover.start(r, plan, "out", [Move(3, 0, 1)]) == []  # not backlogged: a marker
    put(r, plan, 3, [3])
    old.step()
    assert 3 not in old.owned and lag_sample(old, 3) is None and lag_sample(old, 2) == 0
    new = Worker(r, plan, "out", 1)
    new.restore()
    new.step()
    assert new.owned == (3,)
    assert written(r, plan) == [1, 2, 3]


def test_a_backlogged_owner_releases_at_its_next_commit_and_the_backlog_moves_with_the_key_group(r):
    """A marker behind 20 queued entries would wait until the old owner read them all (a fresh worker reads
    one entry per stream, then doubles). Over markerMaxLagRecords the controller asks for a release at the
    old owner's next commit instead: the old owner writes what it read, the new owner the rest, once each."""
    plan = JobPlan(parse_job({**JOB, "spec": {**JOB["spec"], "rescale": {"markerMaxLagRecords": 5}}}), 0)
    for op in plan.spec.operators:
        write_assignment(r, plan.keys, op.name, plan.initial_assignment(op.name))
    for i in range(1, 21):
        put(r, plan, 3, [i])
    old = Worker(r, plan, "out", 0)
    old.restore()
    old.step()
    assert handover.start(r, plan, "out", [Move(3, 0, 1)]) == [3]
    assert not any(b"h" in fields for _, fields in r.xrange(plan.keys.kg_stream("agg", "out", 3)))
    for _ in range(20):
        if 3 not in old.owned:
            break
        time.sleep(0.05)
        old.step()
    assert 3 not in old.owned and handover.moved_to(r, plan, "out", 1) == [3]
    by_old = written(r, plan)
    new = Worker(r, plan, "out", 1)
    new.restore()
    for _ in range(20):
        new.step()
    assert new.owned == (3,) and 0 < len(by_old) < 20
    assert written(r, plan) == list(range(1, 21))
    assert handover.completed(r, plan, "out", [Move(3, 0, 1)])


class WatermarksMove(Instances):
    """Instances whose committed watermark (every kg stream's) advances 100 ms per controller sleep; records
    the committed watermark at which each step's markers were written."""

    def __init__(self, r, plan) -> None:
        super().__init__(r, plan)
        self.watermark = 1550
        self.marked_at: list[int] = []
        self._marked = 0
        self._commit()

    def sleep(self, seconds: float) -> None:
        marked = sum(markers(self.r, self.plan).values())
        if marked > self._marked:
            self.marked_at.append(self.watermark)
            self._marked = marked
        super().sleep(seconds)
        self.watermark += 100
        self._commit()

    def _commit(self) -> None:
        keys = self.plan.keys
        self.r.hset(keys.watermarks("agg"), mapping={
            keys.kg_stream("src", "agg", kg): msgpack.packb([(0, 0, self.watermark)]) for kg in range(12)})


def test_with_short_windows_each_step_starts_right_after_its_key_groups_fired_a_window(r, plan):
    fleet = WatermarksMove(r, plan)
    record = RescaleController(r, plan, fleet, sleep=fleet.sleep).rescale("agg", 3, "fluid")
    assert record["steps"] == 6
    # 1 s windows: every step's markers went in within 100 ms (one commit) after a window end was committed,
    # one step per window.
    assert [mark // 1000 for mark in fleet.marked_at] == [2, 3, 4, 5, 6, 7]
    assert all(mark % 1000 < 100 for mark in fleet.marked_at), fleet.marked_at
