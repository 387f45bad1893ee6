"""The skew-aware rebalance: which key groups move by load, and the rescale that moves them to chosen owners."""

from __future__ import annotations

import pytest
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.keygroups import Assignment
from streamjobs_core.rebalance import balanced, measure
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


def test_load_is_records_delivered_per_second_over_the_window():
    plan = control_plan()
    store = MemoryJobStore()
    store.deploy(plan)
    op = "agg"
    upstream = plan.edges_in(op)[0].upstream

    def sleep(_: float) -> None:
        store.delivered[(upstream, op, 2)] = 500
        store.delivered[(upstream, op, 5)] = 100

    load = measure(store, plan, op, 1.0, sleep)
    assert load[2] == pytest.approx(5 * load[5]) and load[5] > 0 and load[0] == 0
    with pytest.raises(ValueError, match="reads no streams"):
        measure(store, plan, upstream, 1.0, sleep)


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
