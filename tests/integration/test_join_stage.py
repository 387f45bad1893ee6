"""The window join on a real SparkSession: buffered state, firing and matching equal a brute-force join."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from streamjobs_core.keygroups import key_groups_of
from streamjobs_core.spec import JoinStage
from streamjobs_core.watermarks import MAX_WATERMARK
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages.join import IntervalJoin, WindowJoin, make_join
from streamjobs_worker.state import ChangeLog, KeyGroupStore, open_store

from tests.integration.late import late_rows

MAX_P = 12


def join(window: dict | None = None, how: str = "inner", select=None, **kind) -> JoinStage:
    return JoinStage.model_validate({
        "name": "j", "type": "join", "inputs": ["people", "sales"], "on": {"left": ["pid"], "right": ["seller"]},
        "window": window, "how": how, "select": select, **kind,
    })


def sides(rng, n: int, keys: int, span: int):
    left = {"pid": rng.integers(0, keys, n), "name": [f"p{i}" for i in range(n)],
            "event_time": np.sort(rng.integers(0, span, n))}
    right = {"seller": rng.integers(0, keys, n), "amount": rng.integers(1, 1000, n),
             "event_time": np.sort(rng.integers(0, span, n))}
    return left, right


def chunk(columns: dict, lo_t: int, hi_t: int) -> pa.Table:
    t = columns["event_time"]
    keep = (t >= lo_t) & (t < hi_t)
    return pa.table({name: pa.array(np.asarray(values)[keep]) for name, values in columns.items()})


def brute_force(left: dict, right: dict, size: int, step: int, how: str) -> Counter:
    def windows(t):
        last = t - t % step
        return range(last - size + step, last + 1, step)

    rights: dict = {}
    for seller, amount, t in zip(right["seller"], right["amount"], right["event_time"]):
        for ws in windows(int(t)):
            rights.setdefault((int(seller), ws), []).append(int(amount))
    out: Counter = Counter()
    for pid, name, t in zip(left["pid"], left["name"], left["event_time"]):
        for ws in windows(int(t)):
            matches = rights.get((int(pid), ws), [])
            for amount in matches:
                out[(int(pid), name, int(pid), amount, ws)] += 1
            if not matches and how == "left":
                out[(int(pid), name, None, None, ws)] += 1
    return out


def pairs(table: pa.Table | None) -> Counter:
    if table is None:
        return Counter()
    return Counter((r["l_pid"], r["l_name"], r["r_seller"], r["r_amount"], r["window_start"])
                   for r in table.to_pylist())


def feed(logic, left: dict, right: dict, lo_t: int, hi_t: int) -> tuple[pa.Table | None, int]:
    """The rows of both sides from lo_t to hi_t, then the watermark hi_t; the join's output and watermark."""
    batch = InputBatch(tables={"people": [chunk(left, lo_t, hi_t)], "sales": [chunk(right, lo_t, hi_t)]})
    batch.records = sum(t.num_rows for ts in batch.tables.values() for t in ts)
    out, watermark = logic.process(batch, hi_t)
    assert watermark <= hi_t
    return out, watermark


@pytest.mark.parametrize("window,how,backend", [
    ({"type": "tumbling", "sizeMs": 1000}, "inner", "memory"),
    ({"type": "tumbling", "sizeMs": 1000}, "left", "rocksdb"),
    ({"type": "sliding", "sizeMs": 3000, "slideMs": 1000}, "inner", "rocksdb"),
    ({"type": "sliding", "sizeMs": 3000, "slideMs": 1000}, "left", "memory"),
])
def test_window_join_equals_brute_force_and_leaves_no_state(spark, window, how, backend, tmp_path):
    left, right = sides(np.random.default_rng(3), 800, 40, 10_000)
    spec = join(window, how)
    logic = WindowJoin(spec, open_store(backend, range(MAX_P), str(tmp_path / "state")), MAX_P)
    got: Counter = Counter()
    bounds = [0, 1700, 4100, 6600, 10_000]
    for lo, hi in zip(bounds, bounds[1:]):
        out = pairs(feed(logic, left, right, lo, hi)[0])
        assert all(ws + spec.window.size_ms <= hi for *_, ws in out), "a window fired before the watermark passed it"
        got += out
    out, watermark = logic.process(InputBatch(), MAX_WATERMARK)
    got += pairs(out)
    assert watermark == MAX_WATERMARK
    want = brute_force(left, right, spec.window.size_ms, spec.window.step_ms, how)
    assert sum(want.values()) > 100
    assert got == want
    assert all(logic.store.table(kg) is None for kg in logic.store.key_groups), "fired windows leave no state"


def test_late_rows_are_dropped_and_counted(spark):
    logic = WindowJoin(join({"type": "tumbling", "sizeMs": 1000}), KeyGroupStore(range(MAX_P)), MAX_P)
    people = pa.table({"pid": [1, 1], "name": ["a", "b"], "event_time": [100, 2500]})
    sales = pa.table({"seller": [1, 1], "amount": [5, 6], "event_time": [900, 2600]})
    assert logic.process(InputBatch(tables={"people": [people]}, records=2), 2000)[0] is None
    out, _ = logic.process(InputBatch(tables={"sales": [sales]}, records=2), MAX_WATERMARK)
    [(sale, reason)] = late_rows(logic)  # the sale at 900: its window [0, 1000) fired at watermark 2000
    assert sale["amount"] == 5 and "its last window [0, 1000) had fired" in reason
    assert pairs(out) == Counter({(1, "b", 1, 6, 2000): 1})


def test_select_names_the_output_and_the_window_is_added(spark):
    logic = WindowJoin(join({"type": "tumbling", "sizeMs": 1000}, select=["l.name AS who", "r.amount * 2 AS twice"]),
                       KeyGroupStore(range(MAX_P)), MAX_P)
    people = pa.table({"pid": [7], "name": ["x"], "event_time": [10]})
    sales = pa.table({"seller": [7], "amount": [21], "event_time": [20]})
    out, _ = logic.process(InputBatch(tables={"people": [people], "sales": [sales]}, records=2), MAX_WATERMARK)
    assert out.to_pylist() == [{"who": "x", "twice": 42, "window_start": 0, "window_end": 1000, "event_time": 999,
                                "_ingest_ms": 1000}]  # latency is measured from the window's end


def test_keys_of_different_types_are_refused_naming_both_columns(spark):
    logic = WindowJoin(join({"type": "tumbling", "sizeMs": 1000}), KeyGroupStore(range(MAX_P)), MAX_P)
    people = pa.table({"pid": ["7"], "name": ["x"], "event_time": [10]})
    sales = pa.table({"seller": [7], "amount": [21], "event_time": [20]})
    with pytest.raises(ValueError, match="key column 'pid' of 'people' is string, 'seller' of 'sales' is int64"):
        logic.process(InputBatch(tables={"people": [people], "sales": [sales]}, records=2), MAX_WATERMARK)


def test_a_left_join_pads_rows_whose_window_had_no_right_row(spark):
    logic = WindowJoin(join({"type": "tumbling", "sizeMs": 1000}, "left"), KeyGroupStore(range(MAX_P)), MAX_P)
    people = pa.table({"pid": [1, 2], "name": ["a", "b"], "event_time": [10, 20]})
    out, _ = logic.process(InputBatch(tables={"people": [people]}, records=2), MAX_WATERMARK)
    assert sorted(r["l_name"] for r in out.to_pylist()) == ["a", "b"]
    assert all(r["window_start"] == 0 for r in out.to_pylist())


def interval_brute_force(left: dict, right: dict, lower: int, upper: int, how: str) -> Counter:
    out: Counter = Counter()
    for pid, name, lt in zip(left["pid"], left["name"], left["event_time"]):
        met = False
        for seller, amount, rt in zip(right["seller"], right["amount"], right["event_time"]):
            if seller == pid and lower <= rt - lt <= upper:
                out[(int(pid), name, int(seller), int(amount), int(max(lt, rt)))] += 1
                met = True
        if not met and how == "left":
            out[(int(pid), name, None, None, int(lt) + upper)] += 1
    return out


def timed_pairs(table: pa.Table | None) -> Counter:
    if table is None:
        return Counter()
    return Counter((r["l_pid"], r["l_name"], r["r_seller"], r["r_amount"], r["event_time"]) for r in table.to_pylist())


@pytest.mark.parametrize("kind,how,backend", [
    ({"kind": "interval", "lowerMs": -300, "upperMs": 700}, "inner", "memory"),
    ({"kind": "interval", "lowerMs": 200, "upperMs": 900}, "left", "rocksdb"),
    ({"kind": "regular", "ttlMs": 1500}, "left", "memory"),
])
def test_interval_and_regular_joins_equal_brute_force_and_leave_no_state(spark, kind, how, backend, tmp_path):
    left, right = sides(np.random.default_rng(11), 600, 40, 10_000)
    spec = join(None, how, **kind)
    lower, upper = spec.bounds_ms
    logic = IntervalJoin(spec, open_store(backend, range(MAX_P), str(tmp_path / "state")), MAX_P)
    got: Counter = Counter()
    bounds = [0, 900, 2500, 2600, 5300, 8000, 10_000]
    previous_out_wm = None
    for lo, hi in zip(bounds, bounds[1:]):
        out, out_wm = feed(logic, left, right, lo, hi)
        found = timed_pairs(out)
        if previous_out_wm is not None:
            assert all(t >= previous_out_wm for *_, t in found), "a result is late behind the output watermark"
        previous_out_wm = out_wm
        got += found
    out, watermark = logic.process(InputBatch(), MAX_WATERMARK)
    got += timed_pairs(out)
    assert watermark == MAX_WATERMARK
    want = interval_brute_force(left, right, lower, upper, how)
    assert sum(want.values()) > 100
    assert got == want
    assert all(logic.store.table(kg) is None for kg in logic.store.key_groups), "expired rows leave no state"


MOVED_KINDS = [{"window": {"type": "sliding", "sizeMs": 2000, "slideMs": 1000}},
               {"window": None, "kind": "interval", "lowerMs": -500, "upperMs": 1500}]


def assert_left_join_of(spec: JoinStage, left: dict, right: dict, got: Counter) -> None:
    """`got` (timed pairs) is the left join of a MOVED_KINDS spec, brute-forced."""
    if spec.kind == "window":
        want = brute_force(left, right, 2000, 1000, "left")
        got = Counter({(*row[:4], row[4] - 1999): n for row, n in got.items()})  # event_time = window end - 1
    else:
        want = interval_brute_force(left, right, -500, 1500, "left")
    assert sum(want.values()) > 100
    assert got == want


@pytest.mark.parametrize("kind", MOVED_KINDS, ids=["window", "interval"])
def test_waiting_rows_of_both_sides_move_as_snapshot_and_changelog_and_still_meet(spark, kind):
    """Half the key groups leave after two batches: a snapshot (both sides' rows in one table per key group,
    with whether a left row met anyone) goes to a second instance; the rest of the first instance's state is
    rebuilt from its changelog alone."""
    left, right = sides(np.random.default_rng(13), 500, 30, 8000)
    spec = join(how="left", **kind)
    first = make_join(spec, KeyGroupStore(range(MAX_P)), MAX_P)
    got, log = Counter(), ChangeLog()
    for lo, hi in ((0, 1500), (1500, 3300)):
        got += timed_pairs(feed(first, left, right, lo, hi)[0])
        for kg, changes in first.store.drain_changes().items():
            log.add(kg, changes)
    moved, kept = tuple(range(0, MAX_P, 2)), tuple(range(1, MAX_P, 2))
    second = make_join(spec, KeyGroupStore(()), MAX_P)
    replayed = make_join(spec, KeyGroupStore(kept), MAX_P)
    for kg in moved:
        second.store.load(kg, first.store.table(kg))
    for kg, changes in log.fold(first.store.layout).items():
        if kg in kept:
            replayed.store.apply(kg, changes)
    for logic, kgs in ((second, moved), (replayed, kept)):
        logic.restore({kg: 3300 for kg in kgs})
        mine_l = np.isin(key_groups_of(left["pid"], MAX_P), kgs)
        mine_r = np.isin(key_groups_of(right["seller"], MAX_P), kgs)
        part_l = {k: np.asarray(v)[mine_l] for k, v in left.items()}
        part_r = {k: np.asarray(v)[mine_r] for k, v in right.items()}
        got += timed_pairs(feed(logic, part_l, part_r, 3300, 8000)[0])
        got += timed_pairs(logic.process(InputBatch(), MAX_WATERMARK)[0])
    assert_left_join_of(spec, left, right, got)


@pytest.mark.parametrize("kind", MOVED_KINDS, ids=["window", "interval"])
def test_waiting_rows_of_both_sides_split_again_under_another_max_parallelism_still_meet(spark, split_again, kind):
    """Both sides' rows waiting in 12 key groups, committed to Redis, split again by each side's key over 20 (a
    restore under another maxParallelism): the join under 20 key groups goes on and matches as if nothing moved."""
    left, right = sides(np.random.default_rng(29), 500, 30, 8000)
    spec = join(how="left", **kind)
    first = make_join(spec, KeyGroupStore(range(MAX_P)), MAX_P)
    got = Counter()
    for lo, hi in ((0, 1500), (1500, 3300)):
        got += timed_pairs(feed(first, left, right, lo, hi)[0])
    again = split_again(spec, first.store, 20)
    assert any(again.table(kg) is not None for kg in range(MAX_P, 20))
    logic = make_join(spec, again, 20)
    logic.restore(dict.fromkeys(range(20), 3300))
    got += timed_pairs(feed(logic, left, right, 3300, 8000)[0])
    got += timed_pairs(logic.process(InputBatch(), MAX_WATERMARK)[0])
    assert_left_join_of(spec, left, right, got)


def test_an_interval_join_drops_rows_behind_the_watermark(spark):
    logic = IntervalJoin(join(None, kind="interval", lowerMs=0, upperMs=1000), KeyGroupStore(range(MAX_P)), MAX_P)
    people = pa.table({"pid": [1], "name": ["a"], "event_time": [2500]})
    assert logic.process(InputBatch(tables={"people": [people]}, records=1), 2400)[0] is None
    sales = pa.table({"seller": [1, 1], "amount": [5, 6], "event_time": [2300, 2600]})
    out, _ = logic.process(InputBatch(tables={"sales": [sales]}, records=2), 2450)
    [(sale, reason)] = late_rows(logic)  # the sale at 2300, behind the watermark 2400
    assert sale["amount"] == 5 and "event time 2300 is behind" in reason and "(watermark 2400)" in reason
    assert timed_pairs(out) == Counter({(1, "a", 1, 6, 2600): 1})


def test_an_input_without_its_key_column_is_refused_naming_the_join_the_input_and_the_column(spark):
    logic = WindowJoin(join({"type": "tumbling", "sizeMs": 1000}), KeyGroupStore(range(MAX_P)), MAX_P)
    people = pa.table({"id": [1], "name": ["x"], "event_time": [10]})
    with pytest.raises(ValueError, match="j: input 'people' has no column 'pid'"):
        logic.process(InputBatch(tables={"people": [people]}, records=1), 100)


@pytest.mark.parametrize("kind,how", [({"kind": "interval", "lowerMs": 0, "upperMs": 1000}, "inner"),
                                      ({"kind": "interval", "lowerMs": 0, "upperMs": 1000}, "left"),
                                      ({"kind": "regular", "ttlMs": 1000}, "left"),
                                      ({"window": {"type": "tumbling", "sizeMs": 1000}}, "inner"),
                                      ({"window": {"type": "tumbling", "sizeMs": 1000}}, "left")])
def test_a_side_whose_rows_come_first_alone_waits_for_the_other_and_they_meet(spark, kind, how):
    """A new instance's first batches hold only one side's rows (no row of the other side stored yet, nor its
    columns ever seen): nothing to match, nothing to raise; the rows wait and meet the other side later."""
    for first, then in (("sales", "people"), ("people", "sales")):
        logic = make_join(join(how=how, **kind), KeyGroupStore(range(MAX_P)), MAX_P)
        logic.restore()
        tables = {"people": pa.table({"pid": [1, 2], "name": ["a", "b"], "event_time": [100, 150]}),
                  "sales": pa.table({"seller": [1, 1], "amount": [5, 6], "event_time": [200, 300]})}
        out, _ = logic.process(InputBatch(tables={first: [tables[first]]}, records=2), 50)
        assert out is None
        out, _ = logic.process(InputBatch(tables={then: [tables[then]]}, records=2), 60)
        out2, _ = logic.process(InputBatch(), MAX_WATERMARK)
        rows = [r for part in (out, out2) if part is not None for r in part.to_pylist()]
        met = sorted((r["l_name"], r["r_amount"]) for r in rows if r["r_amount"] is not None)
        assert met == [("a", 5), ("a", 6)], (first, rows)
        unmatched = sorted(r["l_name"] for r in rows if r["r_amount"] is None)
        assert unmatched == (["b"] if how == "left" else [])
