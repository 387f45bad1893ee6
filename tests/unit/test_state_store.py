"""KeyGroupStore: columnar state per key group and segment, with a drainable changelog, over every backend."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamjobs_core.statelog import changelog_fields, read_changes, read_snapshot, replay
from streamjobs_worker.state import (
    KG,
    ChangeLog,
    ChangeSet,
    KeyGroupStore,
    KeyGroupTables,
    SegmentTables,
    StateLayout,
    concat,
    open_store,
    replace_rows,
    to_ipc,
)

pytestmark = pytest.mark.unit

WINDOWS = StateLayout(key="k", segment="ws", by_time=True)
KEYED = StateLayout(key="k")


@pytest.fixture(params=["memory", "memory-per-key-group", "rocksdb"])
def make_store(request, tmp_path):
    """The same store tests over every backend, as quix-streams parametrises its state tests: WINDOWS in
    memory is a table per segment, a table per key group and segment the memory of state not laid out by time."""
    counter = itertools.count()

    def make(key_groups, layout: StateLayout | None = WINDOWS) -> KeyGroupStore:
        if request.param == "memory-per-key-group":
            return KeyGroupStore(key_groups, KeyGroupTables(), layout)
        return open_store(request.param, key_groups, str(tmp_path / f"state-{next(counter)}"), layout)

    return make


def rows(kg: int, ws: int, values: dict) -> pa.Table:
    """State rows of one key group and window: key -> v."""
    n = len(values)
    return pa.table({"k": pa.array(list(values), pa.string()), "ws": pa.array([ws] * n, pa.int64()),
                     "v": pa.array(list(values.values()), pa.int64()), KG: pa.array([kg] * n, pa.int64())})


def put(store: KeyGroupStore, kg: int, ws: int, values: dict) -> None:
    """Upsert rows the way a stage does: read, replace, record the rows written."""
    new = rows(kg, ws, values)
    store.update(ws, [kg], lambda current: (replace_rows(current, new, None, "k"), new, None))


def delete(store: KeyGroupStore, kg: int, ws: int, keys: list) -> None:
    gone = rows(kg, ws, dict.fromkeys(keys, 0)).select(["ws", "k", KG])

    def merge(current):
        if current is None:
            return None, None, None
        existed = gone.filter(pa.compute.is_in(gone.column("k"), value_set=current.column("k"), skip_nulls=False))
        return replace_rows(current, None, gone, "k"), None, existed

    store.update(ws, [kg], merge)


def contents(store: KeyGroupStore) -> dict[int, dict[tuple, int]]:
    out = {}
    for kg in store.key_groups:
        table = store.table(kg)
        out[kg] = {} if table is None else {(r["ws"], r["k"]): r["v"] for r in table.to_pylist()}
    return out


def drained(store: KeyGroupStore) -> dict[int, dict[str, Any]]:
    """Drained changes as plain values: upserts {(ws, k): v}, deletes {(ws, k)}, cut."""
    out = {}
    for kg, changes in store.drain_changes().items():
        out[kg] = {
            "upserts": {} if changes.upserts is None else {(r["ws"], r["k"]): r["v"] for r in changes.upserts.to_pylist()},
            "deletes": set() if changes.deletes is None else {(r["ws"], r["k"]) for r in changes.deletes.to_pylist()},
            "cut": changes.cut,
        }
    return out


# --- key groups, reads and writes ---------------------------------------------------------


def test_key_groups_are_those_given(make_store) -> None:
    assert make_store([3, 1, 2]).key_groups == (3, 1, 2)
    assert make_store(range(0)).key_groups == ()
    assert make_store(iter([5])).key_groups == (5,)


def test_rows_are_kept_per_key_group_and_segment(make_store) -> None:
    store = make_store([0, 1])
    put(store, 0, 1000, {"a": 1, "b": 2})
    put(store, 0, 2000, {"a": 3})
    put(store, 1, 1000, {"a": 4})
    assert contents(store) == {0: {(1000, "a"): 1, (1000, "b"): 2, (2000, "a"): 3}, 1: {(1000, "a"): 4}}
    read = store.read([0, 1], 1000)
    assert sorted(zip(read.column(KG).to_pylist(), read.column("k").to_pylist())) == [(0, "a"), (0, "b"), (1, "a")]
    assert store.read([1], 2000) is None


def test_key_groups_not_owned_are_refused(make_store) -> None:
    store = make_store([0, 1])
    with pytest.raises(KeyError):
        put(store, 2, 0, {"a": 1})
    with pytest.raises(KeyError):
        store.read([2])
    with pytest.raises(KeyError):
        store.table(2)
    with pytest.raises(KeyError):
        store.cut({2: 10})
    with pytest.raises(KeyError):
        store.apply(2, ChangeSet(cut=5))
    assert store.key_groups == (0, 1)
    assert store.drain_changes() == {}


def test_a_merge_may_not_write_rows_of_key_groups_it_did_not_read(make_store) -> None:
    store = make_store([0, 1])
    stray = rows(1, 0, {"x": 1})
    with pytest.raises(ValueError, match=r"key groups \[1\] written to segment 0 of key groups \[0\]"):
        store.update(0, [0], lambda current: (stray, stray, None))


def test_memory_holds_state_laid_out_by_time_in_a_table_per_segment() -> None:
    """Chosen when the stage binds its layout: a store opens before its stage exists."""
    by_time, keyed = KeyGroupStore([0, 1]), KeyGroupStore([0, 1])
    by_time.bind(WINDOWS)
    keyed.bind(KEYED)
    assert isinstance(by_time._backend, SegmentTables) and isinstance(keyed._backend, KeyGroupTables)
    put(by_time, 0, 1000, {"a": 1})
    put(by_time, 1, 1000, {"b": 2})
    assert by_time._backend._rows[1000].num_rows == 2  # both key groups' rows in the segment's one table


def test_a_store_binds_one_layout() -> None:
    store = KeyGroupStore([0])
    assert store.layout is None
    store.bind(WINDOWS)
    store.bind(WINDOWS)
    with pytest.raises(ValueError, match="holds"):
        store.bind(KEYED)


# --- the changelog ------------------------------------------------------------------------


def test_changes_are_drained_once_per_key_group(make_store) -> None:
    store = make_store([0, 1, 2])
    put(store, 0, 0, {"a": 1})
    put(store, 2, 0, {"b": 2})
    assert drained(store) == {0: {"upserts": {(0, "a"): 1}, "deletes": set(), "cut": None},
                              2: {"upserts": {(0, "b"): 2}, "deletes": set(), "cut": None}}
    assert store.drain_changes() == {}
    assert contents(store) == {0: {(0, "a"): 1}, 1: {}, 2: {(0, "b"): 2}}


def test_only_the_last_change_of_a_row_is_recorded(make_store) -> None:
    store = make_store([0])
    put(store, 0, 0, {"a": 1, "b": 1})
    put(store, 0, 0, {"a": 2})
    put(store, 0, 0, {"a": 3})
    delete(store, 0, 0, ["b"])
    put(store, 0, 5, {"a": 9})  # same key, another window: another row
    assert drained(store) == {0: {"upserts": {(0, "a"): 3, (5, "a"): 9}, "deletes": {(0, "b")}, "cut": None}}


def test_delete_of_a_missing_row_records_nothing(make_store) -> None:
    store = make_store([0, 1])
    delete(store, 0, 0, ["never"])
    assert store.drain_changes() == {}
    put(store, 1, 0, {"other-kg": 1})
    store.drain_changes()
    delete(store, 0, 0, ["other-kg"])
    assert store.drain_changes() == {}


def test_put_after_delete_within_one_drain_records_the_value(make_store) -> None:
    store = make_store([0])
    put(store, 0, 0, {"a": 1})
    store.drain_changes()
    delete(store, 0, 0, ["a"])
    put(store, 0, 0, {"a": 2})
    assert drained(store) == {0: {"upserts": {(0, "a"): 2}, "deletes": set(), "cut": None}}


def test_a_null_key_is_a_key_like_any_other(make_store) -> None:
    store = make_store([0])
    put(store, 0, 0, {None: 1, "a": 2})
    put(store, 0, 0, {None: 5})
    assert contents(store) == {0: {(0, None): 5, (0, "a"): 2}}
    delete(store, 0, 0, [None])
    assert contents(store) == {0: {(0, "a"): 2}}
    assert drained(store)[0]["deletes"] == {(0, None)}


# --- cuts: windows that fire ----------------------------------------------------------------


def test_a_cut_takes_out_the_segments_up_to_each_key_groups_bound(make_store) -> None:
    store = make_store([0, 1])
    put(store, 0, -1000, {"a": 1})
    put(store, 0, 1000, {"a": 2})
    put(store, 0, 2000, {"b": 3})
    put(store, 1, 1000, {"c": 4})
    put(store, 1, 2**63 - 1, {"ballast": 0})  # a window that never fires
    store.drain_changes()
    taken = store.cut({0: 1000, 1: 0})
    assert sorted(zip(taken.column("ws").to_pylist(), taken.column("k").to_pylist())) == [(-1000, "a"), (1000, "a")]
    assert contents(store) == {0: {(2000, "b"): 3}, 1: {(1000, "c"): 4, (2**63 - 1, "ballast"): 0}}
    assert drained(store) == {0: {"upserts": {}, "deletes": set(), "cut": 1000}}, "only where rows were taken"
    assert store.cut({0: 1500, 1: 500}) is None
    assert store.drain_changes() == {}


def test_a_cut_drops_the_earlier_changes_it_covers_and_keeps_later_ones(make_store) -> None:
    store = make_store([0])
    put(store, 0, 1000, {"a": 1})
    put(store, 0, 3000, {"b": 2})
    store.cut({0: 2000})
    put(store, 0, 1000, {"late": 7})  # after the cut: a replay applies the cut first, then this
    assert drained(store) == {0: {"upserts": {(3000, "b"): 2, (1000, "late"): 7}, "deletes": set(), "cut": 2000}}


def test_a_reset_drops_every_row_and_the_changes_before_it_and_keeps_those_after(make_store) -> None:
    store = make_store([0, 1])
    put(store, 0, 1000, {"a": 1})
    put(store, 1, 1000, {"b": 2})
    store.drain_changes()
    put(store, 0, 2000, {"c": 3})  # before the reset, in the same batch: void
    store.cut({0: 1000})
    assert store.reset() == 2 and store.layout is None and contents(store) == {0: {}, 1: {}}
    store.bind(KEYED)  # the stage built anew binds its own layout
    store.update(0, [1], lambda current: (rows(1, 0, {"d": 4}), rows(1, 0, {"d": 4}), None))
    changes = store.drain_changes()
    assert changes.keys() == {0, 1} and changes[0] == ChangeSet(reset=True)
    assert changes[1].reset and changes[1].cut is None and changes[1].upserts.to_pylist() == [
        {"k": "d", "ws": 0, "v": 4}]

    replayed = make_store([0, 1])
    put(replayed, 0, 1000, {"a": 1})
    put(replayed, 1, 1000, {"b": 2})
    replayed.drain_changes()
    for kg, change in changes.items():  # recovery applies the entry over the rows before
        replayed.apply(kg, change)
    assert contents(replayed) == {0: {}, 1: {(0, "d"): 4}}


def test_a_changelog_folded_across_a_reset_starts_over_at_it() -> None:
    log = ChangeLog()
    log.add(0, ChangeSet(upserts=rows(0, 1000, {"a": 1}).drop_columns([KG]), cut=500))
    log.add(0, ChangeSet(reset=True))
    log.add(0, ChangeSet(upserts=rows(0, 2000, {"b": 2}).drop_columns([KG])))
    log.add(1, ChangeSet(upserts=rows(1, 1000, {"c": 3}).drop_columns([KG])))
    folded = log.fold(WINDOWS)
    assert log.was_reset(0) and not log.was_reset(1)
    assert folded[0].reset and folded[0].cut is None and folded[0].upserts.column("k").to_pylist() == ["b"]
    assert not folded[1].reset


# --- apply, load, table, release --------------------------------------------------------------


def test_apply_replays_without_recording(make_store) -> None:
    store = make_store([0, 1])
    put(store, 0, 0, {"keep": 1, "drop": 2})
    put(store, 0, 500, {"old": 1})
    store.drain_changes()
    store.apply(0, ChangeSet(upserts=rows(0, 0, {"new": 3, "keep": 4}).drop_columns([KG]),
                             deletes=pa.table({"ws": pa.array([0]), "k": ["drop"]}), cut=500))
    store.apply(0, ChangeSet(deletes=pa.table({"ws": pa.array([0]), "k": ["absent"]})))
    assert contents(store) == {0: {(0, "keep"): 4, (0, "new"): 3}, 1: {}}
    assert store.drain_changes() == {}


def test_load_replaces_a_key_group_without_recording(make_store) -> None:
    store = make_store([0, 1])
    put(store, 0, 0, {"old": 1})
    put(store, 1, 0, {"other": 1})
    store.drain_changes()
    store.load(0, pa.concat_tables([rows(0, 0, {"a": 1}), rows(0, 7000, {"a": 2})]).drop_columns([KG]))
    assert contents(store) == {0: {(0, "a"): 1, (7000, "a"): 2}, 1: {(0, "other"): 1}}
    assert store.drain_changes() == {}
    store.load(0, ())
    assert contents(store)[0] == {}
    with pytest.raises(TypeError, match="Arrow table"):
        store.load(0, [(("a", 0), (1,))])


def test_load_of_a_new_key_group_takes_it_over(make_store) -> None:
    store = make_store([0])
    store.load(7, rows(7, 0, {"a": 1}).drop_columns([KG]))
    assert store.key_groups == (0, 7)
    put(store, 7, 0, {"b": 2})
    assert drained(store) == {7: {"upserts": {(0, "b"): 2}, "deletes": set(), "cut": None}}


def test_release_forgets_a_key_group_and_its_state(make_store) -> None:
    store = make_store([0, 7])
    put(store, 7, 0, {"a": 1})
    put(store, 0, 0, {"z": 9})
    store.drain_changes()
    store.release(7)
    assert store.key_groups == (0,) and contents(store) == {0: {(0, "z"): 9}}
    with pytest.raises(KeyError):
        store.read([7])
    store.load(7)  # taken back later: empty until restored
    assert contents(store) == {0: {(0, "z"): 9}, 7: {}}


def test_release_refuses_a_key_group_with_uncommitted_changes(make_store) -> None:
    store = make_store([7])
    put(store, 7, 0, {"a": 1})
    with pytest.raises(RuntimeError, match="key group 7 released with uncommitted changes"):
        store.release(7)
    assert contents(store) == {7: {(0, "a"): 1}}


def test_a_store_of_a_stateless_stage_needs_no_layout(make_store) -> None:
    store = make_store([0], layout=None)
    store.load(3, ())
    store.release(3)
    assert store.drain_changes() == {} and store.table(0) is None


# --- encodings -------------------------------------------------------------------------------


def test_changelog_fields_round_trip() -> None:
    upserts = rows(0, 0, {"a": 1, None: 2}).drop_columns([KG])
    deletes = pa.table({"ws": pa.array([5]), "k": ["b"]})
    back = read_changes(changelog_fields(ChangeSet(upserts, deletes, -(2**63) + 5)))
    assert back.upserts.equals(upserts) and back.deletes.equals(deletes) and back.cut == -(2**63) + 5
    assert set(changelog_fields(ChangeSet(cut=3))) == {b"x"}
    assert read_changes(changelog_fields(ChangeSet(reset=True))) == ChangeSet(reset=True)
    assert not read_changes(changelog_fields(ChangeSet(cut=3))).reset


def test_a_slice_is_encoded_alone() -> None:
    big = rows(0, 0, {f"k{i}": i for i in range(10_000)})
    assert len(to_ipc(big.slice(10, 2))) < len(to_ipc(big)) / 50


def test_snapshot_encoding_round_trips_rows_and_nothing() -> None:
    table = rows(0, 0, {"a": 1}).drop_columns([KG])
    assert read_snapshot(to_ipc(table, {b"covered": b"5-1"})) == (b"5-1", table)
    assert read_snapshot(to_ipc(pa.table({}), {b"covered": b"6-0"})) == (b"6-0", None)


# --- property: replaying the drained changelog reproduces the state -------------------------

KEYS = st.sampled_from(["a", "b", None])
SEGMENTS = st.sampled_from([0, 1000, 2000])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 2), SEGMENTS, st.dictionaries(KEYS, st.integers(-5, 5), min_size=1)),
        st.tuples(st.just("delete"), st.integers(0, 2), SEGMENTS, st.lists(KEYS, min_size=1, max_size=2)),
        st.tuples(st.just("cut"), st.integers(0, 2), SEGMENTS),
        st.tuples(st.just("drain")),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_replaying_the_changelog_reproduces_the_state(make_store, ops: list[tuple]) -> None:
    """Entry by entry (a standby tailing), folded at once (a restore) and in the plain order a re-split reads
    them (statelog.replay): all end where the live store is."""
    live, replica, restored = make_store([0, 1, 2]), make_store([0, 1, 2]), make_store([0, 1, 2])
    plain: dict[int, pa.Table | None] = {0: None, 1: None, 2: None}
    model: dict[int, dict[tuple, int]] = {0: {}, 1: {}, 2: {}}
    bounds = {0: -1, 1: -1, 2: -1}
    log = ChangeLog()

    def drain() -> None:
        for kg, changes in live.drain_changes().items():
            entry = read_changes(changelog_fields(changes))
            replica.apply(kg, entry)
            log.add(kg, entry)
            plain[kg] = replay(plain[kg], entry, WINDOWS)

    for op in ops:
        if op[0] == "put":
            _, kg, ws, values = op
            if ws <= bounds[kg]:
                continue  # a fired window never opens again: the stage drops what comes late
            put(live, kg, ws, values)
            model[kg].update({(ws, k): v for k, v in values.items()})
        elif op[0] == "delete":
            _, kg, ws, keys = op
            delete(live, kg, ws, keys)
            for k in keys:
                model[kg].pop((ws, k), None)
        elif op[0] == "cut":
            _, kg, bound = op
            bounds[kg] = max(bounds[kg], bound)
            live.cut({kg: bounds[kg]})
            model[kg] = {key: v for key, v in model[kg].items() if key[0] > bounds[kg]}
        else:
            drain()
        assert contents(live) == model
    drain()
    for kg, changes in log.fold(WINDOWS).items():
        restored.apply(kg, changes)
    assert contents(replica) == model
    assert contents(restored) == model
    assert {kg: {} if t is None else {(r["ws"], r["k"]): r["v"] for r in t.to_pylist()} for kg, t in plain.items()} \
        == model
    assert live.drain_changes() == {}


def test_rows_without_a_column_others_declare_not_null_concat_into_a_nullable_field():
    before = pa.table({"word": ["a"]})
    after = pa.Table.from_arrays([pa.array(["b"]), pa.array(["B"])], schema=pa.schema(
        [pa.field("word", pa.string(), nullable=False), pa.field("upper", pa.string(), nullable=False)]))
    both = concat([before, after])
    assert both.column("upper").to_pylist() == [None, "B"]
    assert all(field.nullable for field in both.schema) and both.validate(full=True) is None
    assert concat([after, after]).schema == after.schema, "the same schema stays as it is"
