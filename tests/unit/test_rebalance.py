"""The skew-aware rebalance: which key groups move by load, and the rescale that moves them to chosen owners."""

from __future__ import annotations

import pytest
from streamjobs_core.control import ControlEvent, ControlRecord
from streamjobs_core.exchange import Fence, MemoryExchange, Transaction
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.keygroups import Assignment
from streamjobs_core.rebalance import balanced, measure, measure_committed
from streamjobs_core.rescale import RescaleController, RescaleError

from ..jobs.control import control_plan
from .test_rescale_controller import RecordingFleet

pytestmark = pytest.mark.unit


def test_the_hot_key_groups_of_one_instance_spread_with_few_moves():
    current = Assignment(1, (0, 0, 0, 0, 1, 1, 1, 1))
    load = (40.0, 30.0, 20.0, 10.0, 1.0, 1.0, 1.0, 1.0)
    balance = balanced(current, load)
    assert balance.before == (round(100 / 104, 4), round(4 / 104, 4))
    assert max(balance.after) < 0.55  # 52 of 104 is the best whole key groups allow
    moved = [kg for kg, (a, b) in enumerate(zip(current.owners, balance.owners)) if a != b]
    assert all(current.owners[kg] == 0 for kg in moved) and len(moved) <= 2


def test_a_key_group_hotter_than_a_fair_share_stays_alone_and_nothing_oscillates():
    current = Assignment(1, (0, 0, 1, 1))
    balance = balanced(current, (90.0, 5.0, 3.0, 2.0))
    assert balance.owners == (0, 1, 1, 1)
    assert balanced(Assignment(1, balance.owners), (90.0, 5.0, 3.0, 2.0)).owners == balance.owners


def test_an_even_load_moves_nothing():
    current = Assignment(1, (0, 1, 0, 1))
    assert balanced(current, (5.0, 5.0, 5.0, 5.0)).owners == current.owners


def test_load_is_records_read_per_second_between_two_load_events():
    plan = control_plan()
    op = "agg"
    counts = iter([{2: 100, 5: 100}, {2: 600, 5: 200}])
    sent: list[ControlEvent] = []

    def deliver(event: ControlEvent) -> ControlRecord:
        sent.append(event)
        records = dict.fromkeys(range(12), 0) | next(counts)
        halves = {"agg/0": range(6), "agg/1": range(6, 12)}
        return ControlRecord(event, len(sent), {
            i: {"records": {str(kg): records[kg] for kg in kgs}} for i, kgs in halves.items()})

    clock = iter([0.0, 2.0]).__next__
    load = measure(deliver, plan, op, 2.0, sleep=lambda _: None, clock=clock)
    assert [(e.operator, e.name) for e in sent] == [(op, "load")] * 2
    assert load[2] == 250.0 and load[5] == 50.0 and load[0] == 0
    with pytest.raises(ValueError, match="reads no streams"):
        measure(deliver, plan, plan.edges_in(op)[0].upstream, 1.0, sleep=lambda _: None)


def test_a_dry_run_measures_load_from_committed_counts_and_sends_no_event():
    plan = control_plan()
    store = MemoryJobStore()
    store.deploy(plan)
    upstream = plan.edges_in("agg")[0].upstream
    exchange = MemoryExchange(store, plan.keys)

    def consume(counts: dict[int, int]) -> None:  # as the instances of agg commit what they consumed
        txn = Transaction()
        for kg, n in counts.items():
            txn.hincrby(plan.keys.consumed(upstream, "agg"), str(kg), n)
        exchange.commit(txn, Fence("agg", 0, store.new_incarnation("agg", 0)))

    consume({2: 100, 5: 100})

    def wait(_: float) -> None:
        consume({2: 500, 5: 100})

    load = measure_committed(store, plan, "agg", 2.0, sleep=wait, clock=iter([0.0, 2.0]).__next__)
    assert load[2] == 250.0 and load[5] == 50.0 and load[0] == 0
    assert store.plan().version == 0 and store.control_history() == []  # nothing went through the job


def test_a_load_event_that_fails_somewhere_is_not_taken_for_no_load():
    plan = control_plan()

    def deliver(event: ControlEvent) -> ControlRecord:
        return ControlRecord(event, 1, {"agg/0": {"records": {str(kg): 1 for kg in range(6)}},
                                        "agg/1": {"error": "KeyError: 3"}})

    with pytest.raises(RuntimeError, match="agg/1 failed to answer the load event: KeyError: 3"):
        measure(deliver, plan, "agg", 1.0, sleep=lambda _: None)


def test_a_rescale_to_chosen_owners_moves_exactly_those_key_groups_and_resumes_with_them():
    plan = control_plan()
    store = MemoryJobStore()
    store.deploy(plan)
    current = store.assignment("agg")
    owners = tuple(reversed(current.owners))
    record = RescaleController(store, plan, RecordingFleet(store)).rescale("agg", current.parallelism, "all_at_once",
                                                                          owners)
    assert store.assignment("agg").owners == owners
    assert record.moved_key_groups == sum(a != b for a, b in zip(current.owners, owners))
    with pytest.raises(RescaleError, match="every one of its"):
        RescaleController(store, plan, RecordingFleet(store)).rescale("agg", 2, "all_at_once", (0, 1))
