"""KeyGroupStore: keyed state per key group with a drainable changelog; msgpack state encoding."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamjobs_worker.state import KeyGroupStore, open_store, pack, unpack

pytestmark = pytest.mark.unit


@pytest.fixture(params=["memory", "rocksdb"])
def make_store(request, tmp_path):
    """The same store tests over every backend, as quix-streams parametrises its state tests."""
    counter = itertools.count()
    return lambda key_groups: open_store(request.param, key_groups, str(tmp_path / f"state-{next(counter)}"))


def contents(store: KeyGroupStore) -> dict[int, dict[Any, Any]]:
    return {kg: dict(store.items(kg)) for kg in store.key_groups}


# --- put / get / delete -----------------------------------------------------------------


def test_key_groups_are_those_given(make_store) -> None:
    assert make_store([3, 1, 2]).key_groups == (3, 1, 2)
    assert make_store(range(0)).key_groups == ()
    assert make_store(iter([5])).key_groups == (5,)


def test_put_and_get(make_store) -> None:
    store = make_store([0, 1])
    assert store.get(0, "a") is None
    assert store.get(0, "a", default=0) == 0
    store.put(0, "a", 1)
    store.put(0, ("w", 1000), (3, 4.5))
    assert store.get(0, "a") == 1
    assert store.get(0, ("w", 1000)) == (3, 4.5)
    store.put(0, "a", 2)
    assert store.get(0, "a") == 2
    assert dict(store.items(0)) == {"a": 2, ("w", 1000): (3, 4.5)}


def test_key_groups_are_separate(make_store) -> None:
    store = make_store([0, 1])
    store.put(0, "k", "zero")
    store.put(1, "k", "one")
    assert (store.get(0, "k"), store.get(1, "k")) == ("zero", "one")
    store.delete(0, "k")
    assert store.get(0, "k") is None
    assert store.get(1, "k") == "one"
    assert store.drain_changes() == {0: [("k", None)], 1: [("k", "one")]}


def test_key_groups_not_owned_are_refused(make_store) -> None:
    store = make_store([0, 1])
    with pytest.raises(KeyError):
        store.put(2, "a", 1)
    with pytest.raises(KeyError):
        store.get(2, "a")
    with pytest.raises(KeyError):
        store.delete(2, "a")
    with pytest.raises(KeyError):
        list(store.items(2))
    assert store.key_groups == (0, 1)
    assert store.drain_changes() == {}


def test_delete_removes_the_key(make_store) -> None:
    store = make_store([0])
    store.put(0, "a", 1)
    store.put(0, "b", 2)
    store.delete(0, "a")
    assert store.get(0, "a", "gone") == "gone"
    assert dict(store.items(0)) == {"b": 2}


# --- the changelog ------------------------------------------------------------------------


def test_changes_are_drained_once(make_store) -> None:
    store = make_store([0, 1, 2])
    store.put(0, "a", 1)
    store.put(2, "b", 2)
    assert store.drain_changes() == {0: [("a", 1)], 2: [("b", 2)]}
    assert store.drain_changes() == {}
    # Draining does not touch the state.
    assert contents(store) == {0: {"a": 1}, 1: {}, 2: {"b": 2}}


def test_only_the_last_value_of_a_key_is_recorded(make_store) -> None:
    store = make_store([0])
    store.put(0, "a", 1)
    store.put(0, "b", 1)
    store.put(0, "a", 2)
    store.put(0, "a", 3)
    assert store.drain_changes() == {0: [("a", 3), ("b", 1)]}


def test_changes_after_a_drain_are_recorded_again(make_store) -> None:
    store = make_store([0])
    store.put(0, "a", 1)
    store.drain_changes()
    store.put(0, "a", 1)  # same value: still a change to record
    assert store.drain_changes() == {0: [("a", 1)]}


def test_delete_of_a_missing_key_records_nothing(make_store) -> None:
    store = make_store([0, 1])
    store.delete(0, "never")
    assert store.drain_changes() == {}
    store.put(1, "other-kg", 1)
    store.drain_changes()
    store.delete(0, "other-kg")
    assert store.drain_changes() == {}


def test_delete_of_a_drained_key_records_the_deletion(make_store) -> None:
    store = make_store([0])
    store.put(0, "a", 1)
    store.drain_changes()
    store.delete(0, "a")
    assert store.drain_changes() == {0: [("a", None)]}
    # Deleting it again is a no-op.
    store.delete(0, "a")
    assert store.drain_changes() == {}


def test_delete_after_put_within_one_drain_records_the_deletion(make_store) -> None:
    store = make_store([0])
    store.put(0, "a", 1)
    store.delete(0, "a")
    assert store.drain_changes() == {0: [("a", None)]}
    assert store.get(0, "a") is None


def test_put_after_delete_within_one_drain_records_the_value(make_store) -> None:
    store = make_store([0])
    store.put(0, "a", 1)
    store.drain_changes()
    store.delete(0, "a")
    store.put(0, "a", 2)
    assert store.drain_changes() == {0: [("a", 2)]}


def test_delete_twice_after_put_still_records_one_deletion(make_store) -> None:
    store = make_store([0])
    store.put(0, "a", 1)
    store.delete(0, "a")
    store.delete(0, "a")
    assert store.drain_changes() == {0: [("a", None)]}


# --- apply and load ----------------------------------------------------------------------


def test_apply_replays_without_recording(make_store) -> None:
    store = make_store([0, 1])
    store.put(0, "keep", 1)
    store.put(0, "drop", 2)
    store.drain_changes()
    store.apply(0, [("new", 3), ("drop", None), ("keep", 4), ("absent", None)])
    assert dict(store.items(0)) == {"keep": 4, "new": 3}
    assert store.drain_changes() == {}
    assert dict(store.items(1)) == {}


def test_apply_leaves_pending_changes_alone(make_store) -> None:
    store = make_store([0])
    store.put(0, "mine", 1)
    store.apply(0, [("replayed", 2)])
    assert store.drain_changes() == {0: [("mine", 1)]}


def test_load_replaces_a_key_group_without_recording(make_store) -> None:
    store = make_store([0, 1])
    store.put(0, "old", 1)
    store.put(1, "other", 1)
    store.drain_changes()
    store.load(0, [("a", 1), (("w", 5), (2,))])
    assert dict(store.items(0)) == {"a": 1, ("w", 5): (2,)}
    assert store.get(0, "old") is None
    assert dict(store.items(1)) == {"other": 1}
    assert store.drain_changes() == {}


def test_load_copies_the_items(make_store) -> None:
    store = make_store([0])
    source = {"a": 1}
    store.load(0, source.items())
    source["b"] = 2
    assert dict(store.items(0)) == {"a": 1}


def test_load_of_a_new_key_group_takes_it_over(make_store) -> None:
    store = make_store([0])
    store.load(7, [("a", 1)])
    assert store.key_groups == (0, 7)
    store.put(7, "b", 2)
    assert store.drain_changes() == {7: [("b", 2)]}


def test_release_forgets_a_key_group_and_its_state(make_store) -> None:
    store = make_store([0, 7])
    store.put(7, "a", 1)
    store.put(0, "z", 9)
    store.drain_changes()
    store.release(7)
    assert store.key_groups == (0,) and contents(store) == {0: {"z": 9}}
    with pytest.raises(KeyError):
        store.get(7, "a")
    store.load(7, [])  # taken back later: empty until restored
    assert contents(store) == {0: {"z": 9}, 7: {}}


def test_release_refuses_a_key_group_with_uncommitted_changes(make_store) -> None:
    store = make_store([7])
    store.put(7, "a", 1)
    with pytest.raises(RuntimeError, match="key group 7 released with uncommitted changes"):
        store.release(7)
    assert store.get(7, "a") == 1


# --- encoding ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, float("inf"),
        "", "ä日本", b"", b"\x00\xff", ("a", 1), (), ((1, 2), ("x", (None,))),
    ],
)  # fmt: skip
def test_pack_round_trip(value: Any) -> None:
    assert unpack(pack(value)) == value
    assert type(unpack(pack(value))) is type(value)


def test_str_and_bytes_stay_distinct() -> None:
    assert unpack(pack("ab")) == "ab"
    assert unpack(pack(b"ab")) == b"ab"
    assert unpack(pack(["ab", b"ab"])) == ("ab", b"ab")


def test_lists_come_back_as_hashable_tuples() -> None:
    key = unpack(pack(["word", 1000, [1, 2]]))
    assert key == ("word", 1000, (1, 2))
    assert {key: 1}[("word", 1000, (1, 2))] == 1


def test_maps_with_tuple_and_int_keys_round_trip() -> None:
    value = {("w", 1000): (1, 2.5), 7: "seven", "s": {"nested": [1]}}
    assert unpack(pack(value)) == {("w", 1000): (1, 2.5), 7: "seven", "s": {"nested": (1,)}}


def test_changelog_round_trip_replays_into_another_store(make_store) -> None:
    """As recovery does: pack the drained changes, unpack and apply them elsewhere."""
    live = make_store([0, 1])
    live.put(0, ("w", 1000), (1, 2))
    live.put(1, ("w", 2000), (3, 4))
    live.put(1, 42, ("n",))
    live.delete(1, 42)
    recovered = make_store([0, 1])
    for kg, changes in live.drain_changes().items():
        recovered.apply(kg, unpack(pack(changes)))
    assert contents(recovered) == contents(live)
    assert recovered.get(0, ("w", 1000)) == (1, 2)
    assert recovered.drain_changes() == {}


def test_snapshot_round_trip_restores_tuple_keys(make_store) -> None:
    """As recovery does: pack [last id, items], unpack and load them."""
    live = make_store([5])
    live.put(5, ("w", 0), (1,))
    live.put(5, "plain", (2,))
    last_id, items = unpack(pack([b"1-0", list(live.items(5))]))
    restored = make_store([5])
    restored.load(5, items)
    assert last_id == b"1-0"
    assert restored.get(5, ("w", 0)) == (1,)
    assert contents(restored) == contents(live)


# --- property: replaying the drained changelog reproduces the state -----------------------

KEYS = st.one_of(st.sampled_from(["a", "b", "c"]), st.tuples(st.sampled_from(["w", "x"]), st.integers(0, 2)))
VALUES = st.one_of(st.integers(-5, 5), st.tuples(st.integers(0, 9), st.text(max_size=2)))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 2), KEYS, VALUES),
        st.tuples(st.just("delete"), st.integers(0, 2), KEYS),
        st.tuples(st.just("drain")),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_replaying_the_changelog_reproduces_the_state(make_store, ops: list[tuple]) -> None:
    live = make_store([0, 1, 2])
    replica = make_store([0, 1, 2])
    model: dict[int, dict[Any, Any]] = {0: {}, 1: {}, 2: {}}
    changed: dict[int, set[Any]] = {0: set(), 1: set(), 2: set()}

    def drain() -> None:
        changes = live.drain_changes()
        for kg, kvs in changes.items():
            assert kvs, "empty key groups are left out"
            assert len({k for k, _ in kvs}) == len(kvs), "one entry per key"
            # Only keys touched since the last drain, and never a deletion of a key the replica lacks.
            assert {k for k, _ in kvs} <= changed[kg]
            replica.apply(kg, unpack(pack(kvs)))
        for kg in changed:
            changed[kg].clear()

    for op in ops:
        if op[0] == "put":
            _, kg, key, value = op
            live.put(kg, key, value)
            model[kg][key] = value
            changed[kg].add(key)
        elif op[0] == "delete":
            _, kg, key = op
            if key in model[kg]:
                changed[kg].add(key)
            model[kg].pop(key, None)
            live.delete(kg, key)
        else:
            drain()
        assert contents(live) == model
    drain()
    assert contents(replica) == model
    assert live.drain_changes() == {}
