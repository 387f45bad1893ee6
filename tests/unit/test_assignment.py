"""Assignments (ranges, consistent hashing) and the moves between two of them."""

from __future__ import annotations

from collections import Counter

import pytest
from streamjobs_core.keygroups import Assignment, moves

pytestmark = pytest.mark.unit

SCALINGS = [(1, 2), (2, 4), (4, 2), (3, 4), (4, 5), (6, 5), (2, 3)]


@pytest.mark.parametrize("mode", ["ranges", "consistent_hashing"])
@pytest.mark.parametrize("parallelism", [1, 2, 3, 4, 5, 8])
def test_every_instance_owns_key_groups_and_every_key_group_one_owner(mode, parallelism):
    assignment = getattr(Assignment, mode)(parallelism, 120)
    assert len(assignment.owners) == 120
    assert set(assignment.owners) == set(range(parallelism))
    assert sum(len(assignment.owned_by(i)) for i in range(parallelism)) == 120


@pytest.mark.parametrize("old,new", SCALINGS)
def test_moves_list_exactly_the_key_groups_that_change_owner(old, new):
    a, b = Assignment.ranges(old, 120), Assignment.consistent_hashing(new, 120)
    listed = moves(a, b)
    assert {m.key_group for m in listed} == {kg for kg in range(120) if a.owners[kg] != b.owners[kg]}
    assert all(a.owners[m.key_group] == m.source and b.owners[m.key_group] == m.target for m in listed)
    assert moves(a, a) == []


@pytest.mark.parametrize("old,new", SCALINGS)
def test_consistent_hashing_moves_fewer_key_groups_than_ranges(old, new):
    by_ranges = len(moves(Assignment.ranges(old, 120), Assignment.ranges(new, 120)))
    by_ring = len(moves(Assignment.consistent_hashing(old, 120), Assignment.consistent_hashing(new, 120)))
    # The ring moves about |new - old| / max(new, old) of the key groups (plus imbalance).
    assert by_ring <= by_ranges
    assert by_ring <= 120 * abs(new - old) / max(new, old) * 1.4


def test_consistent_hashing_moves_only_towards_a_new_instance_on_scale_out():
    old, new = Assignment.consistent_hashing(4, 120), Assignment.consistent_hashing(5, 120)
    assert {m.target for m in moves(old, new)} == {4}


def test_consistent_hashing_is_deterministic_and_reasonably_balanced():
    assert Assignment.consistent_hashing(4, 120) == Assignment.consistent_hashing(4, 120)
    sizes = Counter(Assignment.consistent_hashing(4, 120).owners).values()
    assert max(sizes) <= 2 * min(sizes)


def test_ranges_moves_for_two_to_four_are_the_known_ninety():
    assert len(moves(Assignment.ranges(2, 120), Assignment.ranges(4, 120))) == 90


def test_moves_refuse_assignments_of_different_sizes():
    with pytest.raises(ValueError):
        moves(Assignment.ranges(2, 120), Assignment.ranges(2, 60))
