"""window_aggregate on a real SparkSession: incremental partials + firing equal a brute-force answer."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from streamjobs_core.keygroups import key_groups_of
from streamjobs_core.spec import WindowAggregateStage
from streamjobs_core.watermarks import MAX_WATERMARK
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages.window import WindowAggregate
from streamjobs_worker.state import KeyGroupStore, open_store

from tests.integration.late import late_rows

MAX_P = 12


def stage(window: dict, lateness: int = 0, where: str | None = None) -> WindowAggregateStage:
    return WindowAggregateStage.model_validate({
        "name": "agg", "type": "window_aggregate", "inputs": ["src"], "keyBy": "k", "window": window,
        "allowedLatenessMs": lateness, "where": where,
        "aggregations": [{"function": "count", "as": "n"}, {"function": "sum", "column": "v", "as": "total"},
                         {"function": "avg", "column": "v", "as": "mean"}, {"function": "min", "column": "v", "as": "lo"},
                         {"function": "max", "column": "v", "as": "hi"}],
    })


def batch(keys, values, times) -> InputBatch:
    table = pa.table({"k": keys, "v": pa.array(values, pa.int64()), "event_time": pa.array(times, pa.int64())})
    return InputBatch(tables={"src": [table]}, records=table.num_rows)


def brute_force(keys, values, times, size, step):
    groups = defaultdict(list)
    for k, v, t in zip(keys, values, times):
        last = t - t % step
        for ws in range(last - size + step, last + 1, step):
            groups[(k, ws)].append(v)
    return {key: (len(vs), sum(vs), sum(vs) / len(vs), min(vs), max(vs)) for key, vs in groups.items()}


def rows(table: pa.Table) -> dict:
    return {(r["k"], r["window_start"]): (r["n"], r["total"], r["mean"], r["lo"], r["hi"]) for r in table.to_pylist()}


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("window", [{"type": "tumbling", "sizeMs": 1000},
                                    {"type": "sliding", "sizeMs": 3000, "slideMs": 1000}])
def test_incremental_windows_equal_brute_force(spark, window, backend, tmp_path):
    rng = np.random.default_rng(7)
    n = 3000
    keys = [f"k{i}" for i in rng.integers(0, 20, n)]
    values = rng.integers(-50, 100, n).tolist()
    times = np.sort(rng.integers(0, 10_000, n)).tolist()
    spec = stage(window)
    logic = WindowAggregate(spec, open_store(backend, range(MAX_P), str(tmp_path / "state")), MAX_P)
    fired: dict = {}
    for chunk in np.array_split(np.arange(n), 4):
        lo, hi = int(chunk[0]), int(chunk[-1]) + 1
        out, out_wm = logic.process(batch(keys[lo:hi], values[lo:hi], times[lo:hi]), times[hi - 1] - 1)
        if out is not None:
            for key, value in rows(out).items():
                assert key not in fired, "a window fired twice"
                fired[key] = value
                assert key[1] + spec.window.size_ms <= times[hi - 1] - 1, "fired before the watermark passed it"
    out, out_wm = logic.process(InputBatch(), MAX_WATERMARK)
    fired.update(rows(out))
    assert out_wm == MAX_WATERMARK
    expected = brute_force(keys, values, times, spec.window.size_ms, spec.window.step_ms)
    assert fired.keys() == expected.keys()
    for key, value in expected.items():
        assert fired[key] == pytest.approx(value), key
    assert all(logic.store.table(kg) is None for kg in logic.store.key_groups), "fired windows leave no state"


def test_only_the_columns_a_window_reads_go_to_spark_unless_its_filter_may_read_any(spark):
    # An interval column: Spark refuses its Arrow type, so the stage works only if the column stays behind.
    table = batch(["a", "b", "a"], [1, 2, 3], [10, 20, 30]).table("src")
    extra = pa.array([(1, 2, 3)] * 3, pa.month_day_nano_interval())
    with_extra = InputBatch(tables={"src": [table.append_column("span", extra)]}, records=3)
    logic = WindowAggregate(stage({"type": "tumbling", "sizeMs": 1000}), KeyGroupStore(range(MAX_P)), MAX_P)
    logic.process(with_extra, 0)
    out, _ = logic.process(InputBatch(), MAX_WATERMARK)
    assert rows(out) == {("a", 0): (2, 4, 2.0, 1, 3), ("b", 0): (1, 2, 2.0, 2, 2)}
    filtered = WindowAggregate(stage({"type": "tumbling", "sizeMs": 1000}, where="note = 'y'"), KeyGroupStore(range(MAX_P)),
                               MAX_P)
    other = pa.table({"k": ["a", "b"], "v": pa.array([1, 2], pa.int64()), "event_time": pa.array([10, 20], pa.int64()),
                      "note": ["x", "y"]})
    filtered.process(InputBatch(tables={"src": [other]}, records=2), 0)
    out, _ = filtered.process(InputBatch(), MAX_WATERMARK)
    assert rows(out) == {("b", 0): (1, 2, 2.0, 2, 2)}


def test_a_sql_stage_sends_spark_only_the_columns_its_query_names(spark):
    from streamjobs_core.spec import SqlStage as SqlSpec
    from streamjobs_worker.stages.sql import SqlStage

    table = batch(["a", "b"], [1, 2], [10, 20]).table("src")
    with_extra = InputBatch(tables={"src": [table.append_column(
        "span", pa.array([(1, 2, 3)] * 2, pa.month_day_nano_interval()))]}, records=2)  # a type Spark refuses
    named = SqlStage(SqlSpec.model_validate({"name": "q", "type": "sql", "inputs": ["src"],
                                             "query": "SELECT k, v * 10 AS v10 FROM input"}), KeyGroupStore(range(1)))
    out, _ = named.process(with_extra, 0)
    assert out.to_pylist() == [{"k": "a", "v10": 10}, {"k": "b", "v10": 20}]
    star = SqlStage(SqlSpec.model_validate({"name": "q", "type": "sql", "inputs": ["src"],
                                            "query": "SELECT * FROM input"}), KeyGroupStore(range(1)))
    with pytest.raises(Exception, match="(?i)interval|unsupported"):
        star.process(with_extra, 0)  # every column goes: this one cannot

    plain = InputBatch(tables={"src": [table]}, records=2)
    named.process(plain, 0)  # what it sends of these columns is known: k and v
    named.reconfigure(SqlSpec.model_validate({"name": "q", "type": "sql", "inputs": ["src"],
                                              "query": "SELECT k, v, event_time FROM input"}))
    out, _ = named.process(plain, 0)  # reconfigured live: the columns the new query names go along
    assert out.column_names == ["k", "v", "event_time"] and out.column("v").to_pylist() == [1, 2]


def test_late_records_are_dropped_and_counted_lateness_delays_firing(spark):
    logic = WindowAggregate(stage({"type": "tumbling", "sizeMs": 1000}, lateness=500), KeyGroupStore(range(MAX_P)), MAX_P)
    out, wm = logic.process(batch(["a", "a"], [1, 2], [100, 900]), 1200)
    assert out is None, "window [0,1000) must wait for allowed lateness (fires at 1500)"
    assert wm == 700
    out, _ = logic.process(batch(["a"], [5], [950]), 1600)  # within lateness: counted, then fires
    assert rows(out) == {("a", 0): (3, 8, 8 / 3, 1, 5)}
    out, _ = logic.process(batch(["a", "b"], [7, 1], [10, 1700]), 1650)
    [(record, reason)] = late_rows(logic)
    assert (record["v"], record["event_time"]) == (7, 10) and "window [0, 1000) had fired" in reason
    assert out is None
    out, _ = logic.process(InputBatch(), MAX_WATERMARK)
    assert rows(out) == {("b", 1000): (1, 1, 1.0, 1, 1)}


def test_late_records_of_sliding_windows_are_counted_once_and_only_when_the_filter_keeps_them(spark):
    spec = stage({"type": "sliding", "sizeMs": 1000, "slideMs": 250}, where="v > 0")
    logic = WindowAggregate(spec, KeyGroupStore(range(MAX_P)), MAX_P)
    logic.process(batch(["a"], [1], [3000]), 2500)
    # At watermark 2500 every window of t=100 and t=1400 has fired (last ends 1250 / 2500); t=1600's last
    # window [1500, 2500) too; t=2000's last window [2000, 3000) has not. v=0 is filtered out: never late.
    out, _ = logic.process(batch(["a", "a", "a", "a", "b"], [1, 2, 3, 4, 0], [100, 1400, 1600, 2000, 100]), 2500)
    late = late_rows(logic)
    assert sorted(record["event_time"] for record, _ in late) == [100, 1400, 1600]  # each once, v=0 never
    assert "its last window [1500, 2500) had fired" in dict((r["event_time"], why) for r, why in late)[1600]
    out, _ = logic.process(InputBatch(), MAX_WATERMARK)
    counts = {ws: n for (k, ws), (n, *_rest) in rows(out).items() if k == "a"}
    # t=2000's windows [1750, 2750) and [2000, 3000) count it; its fired ones [1250, 2250), [1500, 2500) do not.
    assert (counts[1750], counts[2000], 1500 in counts) == (1, 1, False)


def test_restore_rebuilds_timers_from_state(spark):
    spec = stage({"type": "tumbling", "sizeMs": 1000})
    first = WindowAggregate(spec, KeyGroupStore(range(MAX_P)), MAX_P)
    first.process(batch(["x", "y"], [1, 2], [100, 200]), 500)
    changes = first.store.drain_changes()
    store = KeyGroupStore(range(MAX_P))
    second = WindowAggregate(spec, store, MAX_P)
    for kg, entry in changes.items():
        store.apply(kg, entry)
    second.restore()
    out, _ = second.process(InputBatch(), 1000)
    assert rows(out) == {("x", 0): (1, 1, 1.0, 1, 1), ("y", 0): (1, 2, 2.0, 2, 2)}


def test_a_key_group_taken_over_behind_the_others_fires_and_drops_by_its_own_watermark(spark):
    """After a handover the new owner's other key groups may be far ahead: the acquired key group's
    records are not late and its windows fire only when its own streams' watermark passes them."""
    spec = stage({"type": "tumbling", "sizeMs": 1000})
    ahead, behind = (int(g) for g in key_groups_of(pa.array(["a", "b"]), MAX_P))
    store = KeyGroupStore([ahead])
    logic = WindowAggregate(spec, store, MAX_P)
    logic.restore()
    first = batch(["a"], [1], [4500])
    first.watermarks = {ahead: 5000}
    out, _ = logic.process(first, 5000)
    assert rows(out) == {("a", 4000): (1, 1, 1.0, 1, 1)}

    # Its state as the old owner left it: count, sum, avg's sum and count, min, max of window [1000, 2000).
    store.load(behind, pa.table({"k": ["b"], "ws": [1000], "p0_0": [1], "p1_0": [7], "p2_0": [7], "p2_1": [1],
                                 "p3_0": [7], "p4_0": [7]}))
    logic.acquire(behind)
    lagging = batch(["b", "b"], [2, 3], [1500, 2100])
    lagging.watermarks = {ahead: 5000, behind: 1900}
    out, _ = logic.process(lagging, 1900)
    assert late_rows(logic) == []
    assert out is None  # its windows end at 2000 and 3000, past its watermark 1900: not yet
    caught_up = InputBatch(watermarks={ahead: 5000, behind: 3000})
    out, _ = logic.process(caught_up, 3000)
    assert rows(out) == {("b", 1000): (2, 9, 4.5, 2, 7), ("b", 2000): (1, 3, 3.0, 3, 3)}

    store.drain_changes()  # the release commit carries them
    logic.release(behind)
    store.release(behind)
    late = batch(["a"], [9], [4200])
    late.watermarks = {ahead: 5000}
    logic.process(late, 5000)
    assert [r["v"] for r, _ in late_rows(logic)] == [9]  # the key group that stayed keeps its own watermark


def test_results_keep_their_columns_types_and_nulls_merge_across_batches(spark):
    logic = WindowAggregate(stage({"type": "tumbling", "sizeMs": 1000}), KeyGroupStore(range(MAX_P)), MAX_P)
    first = pa.table({"k": pa.array(["a", "a", "b", None]), "v": pa.array([3, 4, None, 5], pa.int32()),
                      "event_time": pa.array([100, 200, 300, 400], pa.int64())})
    assert logic.process(InputBatch(tables={"src": [first]}, records=4), 500)[0] is None
    second = pa.table({"k": pa.array(["a", "b"]), "v": pa.array([None, None], pa.int32()),
                       "event_time": pa.array([500, 600], pa.int64())})
    out, _ = logic.process(InputBatch(tables={"src": [second]}, records=2), MAX_WATERMARK)
    assert out.schema == pa.schema([
        ("k", pa.string()), ("window_start", pa.int64()), ("window_end", pa.int64()), ("n", pa.int64()),
        ("total", pa.int64()), ("mean", pa.float64()), ("lo", pa.int32()), ("hi", pa.int32()),
        ("event_time", pa.int64()), ("_ingest_ms", pa.int64()),
    ])
    assert rows(out) == {("a", 0): (3, 7, 3.5, 3, 4), ("b", 0): (2, None, None, None, None),
                         (None, 0): (1, 5, 5.0, 5, 5)}
    assert out.column("event_time").to_pylist() == [999] * 3 and out.column("window_end").to_pylist() == [1000] * 3


def key_group(key: str) -> int:
    return int(key_groups_of(pa.array([key]), MAX_P)[0])


def test_aggregations_added_live_cover_the_records_after_the_switch_and_read_null_where_none_came(spark):
    """reconfigure.py lets a window's aggregations grow at the end: rows the state holds have no partials for
    the added ones. A record after the switch counts in all of them, one before only in the old; a window no
    later record reached has the added ones null, in place and after a restart under the new spec alike."""
    def spec(*aggregations):
        return WindowAggregateStage.model_validate({
            "name": "agg", "type": "window_aggregate", "inputs": ["src"], "keyBy": "k",
            "window": {"type": "tumbling", "sizeMs": 1000},
            "aggregations": [{"function": "count", "as": "n"}, *aggregations]})

    grown = spec({"function": "sum", "column": "v", "as": "total"}, {"function": "count", "as": "since"},
                 {"function": "avg", "column": "v", "as": "mean"})
    store = KeyGroupStore(range(MAX_P))
    logic = WindowAggregate(spec(), store, MAX_P)
    assert logic.process(batch(["a", "b", "a", "d"], [1, 2, 3, 4], [100, 150, 1100, 2100]), 500)[0] is None
    logic.reconfigure(grown)
    logic.process(batch(["a", "c"], [10, 7], [200, 1200]), 500)
    # Keys new to windows, beside rows from before in their key groups: merged with those (nulls in the added)
    b2, d2 = (next(f"{k}{i}" for i in range(1000) if key_group(f"{k}{i}") == key_group(k)) for k in ("b", "d"))
    assert logic.process(batch([b2, d2], [5, 6], [300, 2900]), 500)[0] is None
    out, _ = logic.process(InputBatch(), 1500)
    columns = ["k", "window_start", "n", "total", "since", "mean"]
    assert sorted(tuple(r[c] for c in columns) for r in out.to_pylist()) == [
        ("a", 0, 2, 10, 1, 10.0), ("b", 0, 1, None, None, None), (b2, 0, 1, 5, 1, 5.0)]
    out, _ = logic.process(InputBatch(), 2500)
    assert sorted(tuple(r[c] for c in columns) for r in out.to_pylist()) == [
        ("a", 1000, 1, None, None, None), ("c", 1000, 1, 7, 1, 7.0)]
    restarted = WindowAggregate(grown, store, MAX_P)  # its only rows came before the switch
    restarted.restore(logic.watermarks())
    out, _ = restarted.process(InputBatch(), MAX_WATERMARK)
    assert sorted(tuple(r[c] for c in columns) for r in out.to_pylist()) == [
        ("d", 2000, 1, None, None, None), (d2, 2000, 1, 6, 1, 6.0)]
