"""Isolating the records a stage fails on, with a stage stand-in that fails on marked records."""

from __future__ import annotations

import pyarrow as pa
import pytest
from streamjobs_worker import poison
from streamjobs_worker.inputs import MIN_WATERMARK, InputBatch


class Picky:
    """Doubles `v`; raises on a batch holding a negative `v` (or on every batch when broken)."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken
        self.calls: list[tuple[int, int]] = []  # (records, watermark) per call

    def process(self, batch: InputBatch, watermark: int):
        self.calls.append((batch.records, watermark))
        values = [v for u in batch.tables for v in batch.table(u).column("v").to_pylist()]
        if self.broken or any(v < 0 for v in values):
            raise ValueError(f"cannot take {min(values)}")
        return (pa.table({"v": [2 * v for v in values]}) if values else None), watermark


def make_batch(*parts: tuple[str, list[int]]) -> InputBatch:
    batch = InputBatch(watermarks={3: 500})
    for upstream, values in parts:
        batch.tables.setdefault(upstream, []).append(pa.table({"v": pa.array(values, pa.int64())}))
        batch.records += len(values)
    return batch


def test_a_good_batch_runs_once() -> None:
    stage = Picky()
    output, watermark, rejected = poison.process(stage, make_batch(("a", [1, 2])), 700)
    assert output.column("v").to_pylist() == [2, 4] and watermark == 700 and rejected == []
    assert stage.calls == [(2, 700)]


def test_the_records_that_fail_alone_are_rejected_and_the_rest_processed() -> None:
    stage = Picky()
    batch = make_batch(("a", [1, -2, 3, 4, 5]), ("b", [6, 7, -8]))
    output, watermark, rejected = poison.process(stage, batch, 700)
    assert sorted(output.column("v").to_pylist()) == [2, 6, 8, 10, 12, 14]
    assert [(r.upstream, r.record) for r in rejected] == [("a", {"v": -2}), ("b", {"v": -8})]
    assert all(r.error == "ValueError: cannot take -2" or r.error == "ValueError: cannot take -8" for r in rejected)
    assert watermark == 700
    # Parts run at MIN (the watermark stays), then one empty call advances it with the batch's watermarks.
    assert all(w == MIN_WATERMARK for _, w in stage.calls[1:-1]) and stage.calls[-1] == (0, 700)


def test_a_stage_that_fails_on_every_record_is_not_a_records_fault() -> None:
    with pytest.raises(poison.BatchFailed, match="all 4 records of the batch fail on their own: ValueError"):
        poison.process(Picky(broken=True), make_batch(("a", [1, 2, 3, 4])), 700)


def test_a_single_bad_record_is_rejected() -> None:
    output, _, rejected = poison.process(Picky(), make_batch(("a", [-1])), 700)
    assert output is None and [r.record for r in rejected] == [{"v": -1}]


def test_split_halves_across_upstreams_in_order() -> None:
    left, right = poison.split(make_batch(("a", [1, 2, 3]), ("b", [4, 5])))
    assert (left.records, right.records) == (2, 3)
    assert left.table("a").column("v").to_pylist() == [1, 2] and "b" not in left.tables
    assert right.table("a").column("v").to_pylist() == [3] and right.table("b").column("v").to_pylist() == [4, 5]


def test_a_python_worker_traceback_is_reduced_to_its_last_line() -> None:
    error = RuntimeError("An exception was thrown from the Python worker.\nTraceback (most recent call last):\n"
                         '  File "udfs.py", line 3, in f\nValueError: no price for 7\n')
    assert poison.describe(error) == "RuntimeError: ValueError: no price for 7"


def test_a_lost_jvm_is_raised_at_once_not_blamed_on_records() -> None:
    from py4j.protocol import Py4JNetworkError

    class Gone(Picky):
        def process(self, batch, watermark):
            self.calls.append((batch.records, watermark))
            raise Py4JNetworkError("Answer from Java side is empty")

    stage = Gone()
    with pytest.raises(Py4JNetworkError):
        poison.process(stage, make_batch(("a", [1])), 700)
    assert len(stage.calls) == 1
