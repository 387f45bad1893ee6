"""The `over` stage on a real SparkSession: each record with aggregates over its key's last N records, in
event-time order whatever the arrival order, equal to a brute-force answer; also after its state moves."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
from streamjobs_core.spec import OverStage
from streamjobs_core.watermarks import MAX_WATERMARK
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages.over import HISTORY, WAITING, Over
from streamjobs_worker.state import ChangeLog, KeyGroupStore

from tests.integration.late import late_rows

MAX_P = 12
ROWS = 4


def spec(*added: dict) -> OverStage:
    return OverStage.model_validate({
        "name": "last", "type": "over", "inputs": ["sales"], "keyBy": "seller", "rows": ROWS,
        "orderBy": ["event_time", "sale"],
        "aggregations": [{"function": "avg", "column": "price", "as": "mean"}, {"function": "count", "as": "n"},
                         {"function": "max", "column": "price", "as": "top"}, *added],
    })


def records(n: int = 900, span: int = 9000):
    rng = np.random.default_rng(17)
    t = rng.integers(0, span, n)
    t[::7] = t[1::7][: len(t[::7])]  # equal times: the tie goes by `sale`
    return {"seller": rng.integers(0, 25, n), "sale": np.arange(n), "price": rng.integers(1, 500, n), "event_time": t}


def brute_force(data: dict) -> Counter:
    out: Counter = Counter()
    for seller in np.unique(data["seller"]):
        mine = np.flatnonzero(data["seller"] == seller)
        mine = mine[np.lexsort((data["sale"][mine], data["event_time"][mine]))]
        for i, row in enumerate(mine):
            window = data["price"][mine[max(0, i - ROWS + 1): i + 1]]
            out[(int(seller), int(data["sale"][row]), round(float(window.mean()), 6), len(window), int(window.max()))] += 1
    return out


def results(table: pa.Table | None) -> Counter:
    if table is None:
        return Counter()
    return Counter((r["seller"], r["sale"], round(r["mean"], 6), r["n"], r["top"]) for r in table.to_pylist())


def batch_between(data: dict, lo: int, hi: int, delay: int) -> InputBatch:
    """The records offered in [lo, hi), each up to `delay` late in event time: out of order within that."""
    offered = data["event_time"] + delay
    keep = (offered >= lo) & (offered < hi)
    order = np.random.default_rng(lo).permutation(np.flatnonzero(keep))
    table = pa.table({k: pa.array(v[order]) for k, v in data.items()})
    return InputBatch(tables={"sales": [table]}, records=table.num_rows)


def test_each_record_is_aggregated_with_its_keys_last_rows_in_event_time_whatever_the_arrival_order(spark):
    data = records()
    logic = Over(spec(), KeyGroupStore(range(MAX_P)), MAX_P)
    got, log = Counter(), ChangeLog()
    bounds = [0, 1200, 3100, 3150, 6000, 9700]
    for lo, hi in zip(bounds, bounds[1:]):
        out, watermark = logic.process(batch_between(data, lo, hi, 500), hi - 500)
        assert watermark == hi - 500
        assert out is None or min(out.column("event_time").to_pylist()) >= lo - 500 - 500
        got += results(out)
        for kg, changes in logic.store.drain_changes().items():
            log.add(kg, changes)
        if hi == 3150:  # from here on, a new instance whose state is only the changelog
            logic = Over(spec(), KeyGroupStore(range(MAX_P)), MAX_P)
            for kg, changes in log.fold(logic.store.layout).items():
                logic.store.apply(kg, changes)
            logic.restore(dict.fromkeys(range(MAX_P), hi - 500))
    got += results(logic.process(InputBatch(), MAX_WATERMARK)[0])
    assert late_rows(logic) == []
    assert got == brute_force(data)
    for kg in logic.store.key_groups:
        assert logic.store.read([kg], WAITING) is None, "every record went out"
        history = logic.store.read([kg], HISTORY)
        if history is not None:
            assert max(Counter(history.column("seller").to_pylist()).values()) <= ROWS - 1


def test_history_and_waiting_records_split_again_under_another_max_parallelism_give_the_same_frames(spark, split_again):
    """A key's history and the records waiting for the watermark, committed in 12 key groups, split again over
    20 (a restore under another maxParallelism): every record still meets its key's last rows."""
    data = records()
    logic = Over(spec(), KeyGroupStore(range(MAX_P)), MAX_P)
    got = results(logic.process(batch_between(data, 0, 3000, 500), 2000)[0])
    waiting = sum(t.num_rows for kg in range(MAX_P) if (t := logic.store.read([kg], WAITING)) is not None)
    assert waiting > 30
    again = Over(spec(), split_again(spec(), logic.store, 20), 20)
    again.restore(dict.fromkeys(range(20), 2000))
    got += results(again.process(batch_between(data, 3000, 9700, 500), 9200)[0])
    got += results(again.process(InputBatch(), MAX_WATERMARK)[0])
    assert late_rows(again) == []
    assert got == brute_force(data)


def test_a_record_behind_the_watermark_is_dropped_and_counted(spark):
    logic = Over(spec(), KeyGroupStore(range(MAX_P)), MAX_P)
    first = pa.table({"seller": [1], "sale": [1], "price": [10], "event_time": [1000]})
    out, _ = logic.process(InputBatch(tables={"sales": [first]}, records=1), 1500)
    assert results(out) == Counter({(1, 1, 10.0, 1, 10): 1})
    late = pa.table({"seller": [1, 1], "sale": [2, 3], "price": [20, 30], "event_time": [1400, 1600]})
    out, _ = logic.process(InputBatch(tables={"sales": [late]}, records=2), MAX_WATERMARK)
    [(sale, reason)] = late_rows(logic)
    assert sale["sale"] == 2 and "event time 1400 is behind" in reason
    assert results(out) == Counter({(1, 3, 20.0, 2, 30): 1})


def test_records_with_a_column_the_input_gained_live_meet_the_history_from_before_it(spark):
    logic = Over(spec(), KeyGroupStore(range(MAX_P)), MAX_P)
    first = pa.table({"seller": [1], "sale": [1], "price": [10], "event_time": [1000]})
    logic.process(InputBatch(tables={"sales": [first]}, records=1), 1500)
    gained = pa.table({"seller": [1], "sale": [2], "price": [30], "event_time": [2000], "region": ["eu"]})
    gained = gained.cast(gained.schema.set(4, pa.field("region", pa.string(), nullable=False)))  # as Spark says
    out, _ = logic.process(InputBatch(tables={"sales": [gained]}, records=1), MAX_WATERMARK)
    assert results(out) == Counter({(1, 2, 20.0, 2, 30): 1}) and out.column("region").to_pylist() == ["eu"]

    # Without history (rows 1): records from before the gain wait beside later ones, in one state table.
    alone = Over(spec().model_copy(update={"rows": 1}), KeyGroupStore(range(MAX_P)), MAX_P)
    alone.process(InputBatch(tables={"sales": [first]}, records=1), 500)
    out, _ = alone.process(InputBatch(tables={"sales": [gained]}, records=1), MAX_WATERMARK)
    assert sorted(out.column("region").to_pylist(), key=str) == [None, "eu"]


def lowest_in_frame(data: dict) -> dict[int, int]:
    """Per sale, the lowest price among its seller's last ROWS sales in event-time order (itself included)."""
    out = {}
    for seller in np.unique(data["seller"]):
        mine = np.flatnonzero(data["seller"] == seller)
        mine = mine[np.lexsort((data["sale"][mine], data["event_time"][mine]))]
        for i, row in enumerate(mine):
            out[int(data["sale"][row])] = int(data["price"][mine[max(0, i - ROWS + 1): i + 1]].min())
    return out


def test_an_aggregation_added_live_covers_each_record_read_after_the_switch_over_its_whole_frame(spark):
    """`low` is added at a switch after the records offered before 3,000 were read: those the watermark had
    passed went out without it, those still waiting go out with it null (read under the old plan), and every
    record read after gets it over its whole frame, history from before the switch included; also in an
    instance that restarts from the changelog right after the switch."""
    data = records()
    low = {"function": "min", "column": "price", "as": "low"}
    logic = Over(spec(), KeyGroupStore(range(MAX_P)), MAX_P)
    first, _ = logic.process(batch_between(data, 0, 3000, 500), 2000)
    waiting = sum(logic.store.read([kg], WAITING).num_rows for kg in range(MAX_P) if logic.store.read([kg], WAITING))
    assert first.num_rows and "low" not in first.column_names and waiting > 30
    logic.reconfigure(spec(low))
    log = ChangeLog()
    for kg, changes in logic.store.drain_changes().items():
        log.add(kg, changes)
    restarted = Over(spec(low), KeyGroupStore(range(MAX_P)), MAX_P)
    for kg, changes in log.fold(restarted.store.layout).items():
        restarted.store.apply(kg, changes)
    restarted.restore(dict.fromkeys(range(MAX_P), 2000))
    read_before = set(data["sale"][data["event_time"] + 500 < 3000].tolist())
    expected = lowest_in_frame(data)
    for stage in (logic, restarted):
        got, columns = {}, set()
        for batch, watermark in ((batch_between(data, 3000, 6000, 500), 5500),
                                 (batch_between(data, 6000, 9700, 500), 9200), (InputBatch(), MAX_WATERMARK)):
            out = stage.process(batch, watermark)[0]
            if out is not None:
                got.update((r["sale"], r["low"]) for r in out.to_pylist())
                columns.update(out.column_names)
        assert len(got) == len(data["sale"]) - first.num_rows
        assert sum(low is None for low in got.values()) == waiting
        assert got == {sale: None if sale in read_before else expected[sale] for sale in got}
        assert columns == {*first.column_names, "low"}, "the mark stays inside"
