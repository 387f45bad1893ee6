"""The job store's records round-trip the same through Redis and through memory (one test, both backends)."""

from __future__ import annotations

import json

import pytest
from streamjobs_core.control import (
    InstanceAddress,
    PartitionProgress,
    Phase,
    Promotion,
    RescaleRecord,
    RescaleRequest,
    RescaleState,
    StandbyStatus,
    Strategy,
)
from streamjobs_core.exchange import Fence, MemoryExchange, RedisExchange, Transaction
from streamjobs_core.jobstore import MemoryJobStore, RedisJobStore
from streamjobs_core.keygroups import Assignment

from ..jobs.control import control_plan


@pytest.fixture(params=["redis", "memory"])
def store(request):
    if request.param == "memory":
        return MemoryJobStore()
    return RedisJobStore(request.getfixturevalue("r"), "ctl")


def commit(store, txn: Transaction) -> None:
    """What a worker's Checkpoint does with the transaction: commit it through the job's exchange. Until then
    the records written into it are not in the store."""
    if isinstance(store, RedisJobStore):
        exchange = RedisExchange(store.r, store)
    else:
        exchange = MemoryExchange(store, control_plan().keys)
    exchange.commit(txn, Fence("agg", 0, store.new_incarnation("agg", 0)))


def test_deploy_assignments_and_the_final_switch(store):
    plan = control_plan()
    store.deploy(plan, owner="uid-1")
    assert store.plan() == plan and store.deployed_by() == "uid-1"
    assert store.assignment("agg") == plan.initial_assignment("agg") and store.upcoming_assignment("agg") is None
    assert store.restamp(123).t0_ms == 123 and store.plan().t0_ms == 123
    store.publish_upcoming("agg", Assignment(2, (0, 1, 2) * 4))
    assert store.upcoming_assignment("agg") == Assignment(2, (0, 1, 2) * 4)
    txn = Transaction()
    store.release_in(txn, "agg", {4: 1})
    commit(store, txn)
    store.request_release("src", {0: 1})
    store.request_release("agg", {5: 1})
    store.record_acquired("agg", [4], 1)
    assert store.ownership("agg") == (plan.initial_assignment("agg"), {4: 1})
    assert store.release_requests("src") == {0: 1} and store.release_requests("agg") == {5: 1}
    assert store.acquired("agg") == {4: 1}
    store.finish_handover("agg", Assignment(2, (0,) * 4 + (1,) * 8))
    assert store.ownership("agg") == (Assignment(2, (0,) * 4 + (1,) * 8), {})
    assert store.acquired("agg") == {} and store.release_requests("agg") == {}
    assert store.release_requests("src") == {0: 1}  # another operator's handover is its own
    assert store.new_incarnation("agg", 0) + 1 == store.new_incarnation("agg", 0)
    assert store.clear() > 0 and store.plan() is None and store.assignment("agg") is None


def test_rescale_state_history_and_requests(store):
    state = RescaleState("agg", 2, 4, Strategy.BATCHED, 2, Phase.PRESTAGE, 1.5)
    store.save_rescale(state)
    assert store.rescale_state() == state
    store.save_rescale(state.at(Phase.HANDOVER, released_at_commit=3))
    assert store.rescale_state().phase == Phase.HANDOVER and store.rescale_state().released_at_commit == 3
    record = RescaleRecord.of(state.at(Phase.RETIRE, moved_key_groups=6, steps=2), 310.5, 12.25)
    store.end_rescale(record)
    assert store.rescale_state() is None and store.rescale_history() == [record]
    assert store.rescale_history(1) == []
    assert record.as_dict()["from"] == 2 and json.loads(record.encode())["strategy"] == "batched"
    store.request_rescale(RescaleRequest("agg", 3))
    store.request_rescale(RescaleRequest("agg", 1, Strategy.FLUID))
    assert store.rescale_requests() == [RescaleRequest("agg", 3), RescaleRequest("agg", 1, Strategy.FLUID)]
    assert store.next_rescale_request() == RescaleRequest("agg", 3)
    assert store.next_rescale_request().strategy == Strategy.FLUID and store.next_rescale_request() is None
    store.save_rescale(state)
    store.publish_upcoming("agg", Assignment(2, (0,) * 12))
    store.report_standby("agg", 0, 2)
    store.drop_rescale("agg")
    assert store.rescale_state() is None and store.upcoming_assignment("agg") is None and store.standbys("agg") == []


def test_standbys_spares_instances_and_the_stop_flag(store):
    store.report_standby_lag("agg", 1, 40)
    store.report_standby("agg", 0, 2)
    assert store.standbys("agg") == [StandbyStatus(0, 2, None), StandbyStatus(1, None, 40)]
    store.spare_ready("agg", "s1")
    store.spare_ready("agg", "s2")
    store.promote("agg", "s1", Promotion(3, await_epoch=2))
    assert store.ready_spares("agg") == {"s2"}
    store.spare_gone("agg", "s2")
    assert store.ready_spares("agg") == set()
    assert store.await_promotion("agg", "s1", 0.1) == Promotion(3, 2)
    assert store.await_promotion("agg", "s2", 0.1) is None
    store.demote("agg", 3, "s3")
    assert store.demoted_as("agg", 3) == "s3" and store.demoted_as("agg", 3) is None
    store.promote_pod("agg", 2, 5)
    store.promote_pod("agg", 3, 5)
    store.demote_pods("agg", [3, 4])
    assert (store.promoted_pod("agg", 2), store.promoted_pod("agg", 3), store.promoted_pod("other", 2)) == (5, None, None)
    store.register(InstanceAddress("agg", 0, "10.0.0.1:9100"))
    store.register(InstanceAddress("my/op", 1, "h:1"))  # an operator name may hold the separator
    assert store.registered() == {("agg", 0): "10.0.0.1:9100", ("my/op", 1): "h:1"}
    store.unregister("agg", 0)
    assert list(store.registered()) == [("my/op", 1)]
    assert not store.stop_requested()
    store.request_stop()
    assert store.stop_requested()


def test_committed_input_progress(store):
    txn = Transaction()
    store.record_partitions(txn, "src", {0: PartitionProgress(b"17-0", 5, 9, 4), 1: PartitionProgress(40)},
                            watermarks={0: 1200})
    store.record_streams(txn, "agg", {"stream-a": (b"5-1", [(0, 3, 700), (4, 11, 650)])})
    assert store.partitions("src", [0]) == {0: (None, None)}  # recorded into the commit: nothing before it
    assert store.streams("agg", ["stream-a"]) == [(None, None)]
    commit(store, txn)
    got = store.partitions("src", [0, 1, 2])
    assert got[0] == (PartitionProgress(b"17-0", 5, 9, 4), 1200)
    assert int(got[1][0].cursor) == 40 and got[1][0].records is None and got[1][1] is None
    assert got[2] == (None, None)
    assert store.streams("agg", ["stream-a", "stream-b"]) == [(b"5-1", [(0, 3, 700), (4, 11, 650)]), (None, None)]


def test_plan_versions_switches_cuts_and_reconfiguration_records(store):
    from dataclasses import replace

    from streamjobs_core.control import ReconfigureRecord, ReconfigureRequest, ReconfigureState

    plan = control_plan()
    store.deploy(plan)
    newer = replace(plan, version=1)
    state = ReconfigureState(1, 12.5, ("spec.stages[agg].where: live",), "req-1")
    store.publish_plan(newer, state)
    assert store.plan() == newer and store.plan_version(0) == plan and store.plan_version(1) == newer
    assert store.plans() == [plan, newer] and store.reconfigure_state() == state
    txn = Transaction()
    store.record_versions(txn, "agg", [0, 3], 1)
    store.record_cut(txn, "src", 1, {0: 17, 2: 40})
    store.record_aligned(txn, "agg", 1, 1, 12.5)
    commit(store, txn)
    assert store.versions("agg") == {0: 1, 3: 1}
    assert store.cut(1) == {("src", 0): b"17", ("src", 2): b"40"}
    assert store.aligned(1) == {"agg/1": 12.5}
    record = ReconfigureRecord(1, state.changes, "req-1", 0.8, 12.5, {"agg/1": 12.5})
    store.end_reconfigure(record)
    assert store.reconfigure_state() is None and store.reconfigure_history() == [record]
    request = ReconfigureRequest('{"kind": "StreamJob"}', "req-2")
    store.request_reconfigure(request)
    assert store.next_reconfigure_request() == request and store.next_reconfigure_request() is None


def test_control_events_their_replies_and_records(store):
    from dataclasses import replace

    from streamjobs_core.control import ControlEvent, ControlRecord, ReconfigureRecord, ReconfigureState

    plan = control_plan()
    store.deploy(plan)
    event = ControlEvent("e-1", "agg", "load", {"k": "v"})
    store.request_control(event)
    assert store.next_control_request() == event and store.next_control_request() is None
    carrying = replace(plan, version=1, control=event)
    store.publish_plan(carrying, ReconfigureState(1, 1.0, ("control load -> agg",), "e-1"))
    assert store.plan() == carrying and store.plan().control == event
    txn = Transaction()
    store.record_reply(txn, "e-1", "agg", 1, json.dumps({"records": {"6": 3}}))
    commit(store, txn)
    assert store.replies("e-1") == {"agg/1": {"records": {"6": 3}}}
    record = ControlRecord(event, 1, store.replies("e-1"), 0.4, 2.0)
    store.end_reconfigure(ReconfigureRecord(1, ("control load -> agg",), "e-1"), record)
    assert store.control_history() == [record] and store.reconfigure_state() is None
