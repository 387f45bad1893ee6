"""The worker's side of the handover (ownership.py) against the in-memory job store."""

from __future__ import annotations

from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_worker.ownership import Ownership

from ..jobs.control import control_plan


def _ownership(store, instance: int, clock) -> Ownership:
    return Ownership(store, control_plan(), "agg", instance, clock=clock)


def test_an_instance_releases_at_its_markers_and_when_asked_and_its_new_owner_takes_over():
    plan, store, now = control_plan(), MemoryJobStore(), [0.0]
    store.deploy(plan)
    old, new = _ownership(store, 0, lambda: now[0]), _ownership(store, 1, lambda: now[0])
    assert old.owned == tuple(range(6)) and new.owned == tuple(range(6, 12))
    store.request_release("agg", {4: 1, 7: 0})  # 7 is not instance 0's to give
    assert old.arrivals() == [] and new.arrivals() == []
    releases = old.releases(at_markers={2: 1})
    assert releases == {2: 1, 4: 1}
    old.release_in(None, releases)  # the memory store applies at once; Redis adds it to the commit
    old.released(releases)
    assert old.owned == (0, 1, 3, 5)
    now[0] += 0.05
    assert new.arrivals() == []  # polled 50 ms ago: not looked at again yet
    now[0] += 0.1
    assert new.arrivals() == [2, 4]
    new.taken_over([2, 4])
    assert new.owned == (2, 4, 6, 7, 8, 9, 10, 11) and store.acquired("agg") == {2: 1, 4: 1}
    assert new.arrivals() == []


def test_a_restarted_instance_sees_what_was_moved_to_it_and_says_so_again():
    plan, store = control_plan(), MemoryJobStore()
    store.deploy(plan)
    store.release_in(None, "agg", {3: 1})  # released by instance 0; instance 1 died before saying it took it
    restarted = _ownership(store, 1, lambda: 0.0)
    assert 3 in restarted.owned and store.acquired("agg") == {}
    restarted.resumed()
    assert store.acquired("agg") == {3: 1}
    assert 3 not in _ownership(store, 0, lambda: 0.0).owned


def test_a_key_group_released_while_the_new_instance_starts_is_taken_over_not_said_taken():
    """A pod added by a scale-out reads who owns what, then starts Spark; the old owner releases meanwhile.
    Its restore may not say that key group taken (the controller would finish the handover, the moved key groups
    would go, and nobody would take it over): it is an arrival, loaded and said taken once taken over."""
    plan, store = control_plan(), MemoryJobStore()
    store.deploy(plan)
    starting = _ownership(store, 1, lambda: 1.0)
    store.release_in(None, "agg", {3: 1})  # while instance 1 started
    starting.resumed()
    assert 3 not in starting.owned and store.acquired("agg") == {}
    assert starting.arrivals() == [3]
    starting.taken_over([3])
    assert 3 in starting.owned and store.acquired("agg") == {3: 1}
