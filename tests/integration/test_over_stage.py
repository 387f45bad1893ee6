"""The `over` stage on a real SparkSession: each record with aggregates over its key's last N records, in
event-time order whatever the arrival order, equal to a brute-force answer; also after its state moves."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
from streamjobs_core.spec import OverStage
from streamjobs_core.watermarks import MAX_WATERMARK
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.over import HISTORY, WAITING, Over
from streamjobs_worker.state import ChangeLog, KeyGroupStore

MAX_P = 12
ROWS = 4


def spec() -> OverStage:
    return OverStage.model_validate({
        "name": "last", "type": "over", "inputs": ["sales"], "keyBy": "seller", "rows": ROWS,
        "orderBy": ["event_time", "sale"],
        "aggregations": [{"function": "avg", "column": "price", "as": "mean"}, {"function": "count", "as": "n"},
                         {"function": "max", "column": "price", "as": "top"}],
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
    assert logic.late_records == 0
    assert got == brute_force(data)
    for kg in logic.store.key_groups:
        assert logic.store.read([kg], WAITING) is None, "every record went out"
        history = logic.store.read([kg], HISTORY)
        if history is not None:
            assert max(Counter(history.column("seller").to_pylist()).values()) <= ROWS - 1


def test_a_record_behind_the_watermark_is_dropped_and_counted(spark):
    logic = Over(spec(), KeyGroupStore(range(MAX_P)), MAX_P)
    first = pa.table({"seller": [1], "sale": [1], "price": [10], "event_time": [1000]})
    out, _ = logic.process(InputBatch(tables={"sales": [first]}, records=1), 1500)
    assert results(out) == Counter({(1, 1, 10.0, 1, 10): 1})
    late = pa.table({"seller": [1, 1], "sale": [2, 3], "price": [20, 30], "event_time": [1400, 1600]})
    out, _ = logic.process(InputBatch(tables={"sales": [late]}, records=2), MAX_WATERMARK)
    assert logic.late_records == 1
    assert results(out) == Counter({(1, 3, 20.0, 2, 30): 1})
