"""The latency benchmark's bookkeeping: the peer's shape read from our job, percentiles, ratios, verification."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from streamjobs.bench import latency
from streamjobs.bench.sss_peer import Q5Shape
from streamjobs_core.loading import load_job

EXAMPLE = Path(__file__).parents[2] / "examples" / "nexmark-q5.yaml"


def _report(p50: float, p99: float, verification: dict | None = None) -> dict:
    return {"latency_second_half_ms": {"p50_ms": p50, "p95_ms": p99, "p99_ms": p99, "max_ms": p99},
            "verification": verification}


def _peer(latencies: list[float]) -> dict:
    return {"latencies_ms": np.asarray(latencies), "input_records_per_s": 2000.0, "batches": 40,
            "batch_p50_ms": 250.0, "stateful_operators": 4}


def test_the_peer_takes_its_windows_and_events_from_our_job():
    assert latency.q5_shape(latency.q5_job(1234)) == Q5Shape(
        size_ms=4000, slide_ms=1000, max_window_ms=1000, active_auctions=200, hot_auction_ratio=0.5,
        out_of_order_ms=100,
    )


def test_the_bench_job_is_the_example_q5_with_shorter_windows():
    bench, example = latency.q5_job(2000).spec, load_job(str(EXAMPLE)).spec
    for ours, theirs in zip(bench.stages, example.stages, strict=True):
        assert (ours.name, ours.type, ours.inputs) == (theirs.name, theirs.type, theirs.inputs)
        assert ours.model_dump(exclude={"window"}) == theirs.model_dump(exclude={"window"})
    assert bench.sources[0].rate.records_per_second == 2000


def test_percentiles_of_both_sides_and_the_p99_ratio():
    keys = latency.at_rate(_report(300.0, 900.0), _peer(list(range(1, 101))))
    assert keys["peer_p50_ms"] == pytest.approx(50.5)
    assert keys["peer_p99_ms"] == pytest.approx(99.01)
    assert (keys["ours_p50_ms"], keys["ours_p99_ms"]) == (300.0, 900.0)
    assert keys["p99_ratio"] == pytest.approx(900.0 / 99.01)
    assert keys["peer_samples"] == 100


def test_no_ratio_without_a_measurement_on_either_side():
    assert latency.at_rate(_report(300.0, 900.0), _peer([]))["p99_ratio"] is None
    assert latency.p99_ratio(None, 500.0) is None
    assert latency.p99_ratio(500.0, 0.0) is None
    assert latency.p99_ratio(500.0, 1000.0) == 0.5


def test_saturation_is_the_first_stage_input_per_second():
    flood = {"duration_s": 20.0, "operators": {"bids-per-auction": {"records_in": 300_000}, "hottest": {}}}
    assert latency.saturation(flood) == 15_000


def test_verification_sums_losses_and_needs_every_run_correct():
    good = {"correct": True, "lost": 0, "duplicated": 0}
    runs = [_report(1, 1, good), _report(1, 1, {"correct": False, "lost": 3, "duplicated": 2}), _report(1, 1, good)]
    assert latency.verification_totals(runs) == {"lost": 3, "duplicated": 2, "correct": False}
    assert latency.verification_totals([_report(1, 1, good)] * 3) == {"lost": 0, "duplicated": 0, "correct": True}
    undrained = {"correct": False, "reason": "the job did not drain; its output is incomplete"}
    assert latency.verification_totals([_report(1, 1, good), _report(1, 1, undrained)])["correct"] is False
    assert latency.verification_totals([_report(1, 1, None)])["correct"] is False


def test_flink_is_skipped_when_pyflink_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyflink", None)  # makes `import pyflink` raise ImportError
    assert latency.flink_peer() is None
