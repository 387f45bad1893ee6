"""The rescale benchmark's measures, on timelines whose answers are known."""

from __future__ import annotations

import numpy as np
from streamjobs.bench.rescale import drift_ms, held_up_ms, longest_gap_ms, output_gap_ms, per_bin, summary


def test_the_longest_gap_counts_the_window_edges():
    times = np.array([1_000, 1_100, 1_900, 5_000])
    assert longest_gap_ms(times, 1_000, 2_000) == 800  # 1,100 -> 1,900
    assert longest_gap_ms(times, 1_950, 3_000) == 1_050  # nothing inside: the whole window
    assert longest_gap_ms(times, 0, 1_100) == 1_000  # from the start edge to the first event


def test_an_output_gap_is_the_worst_moved_key_group_not_the_others():
    times = np.array([0, 100, 200, 300, 400, 0, 400])
    groups = np.array([1, 1, 1, 1, 1, 2, 2])
    assert output_gap_ms(times, groups, [1], 0, 400) == 100
    assert output_gap_ms(times, groups, [1, 2], 0, 400) == 400
    assert output_gap_ms(times, groups, [3], 0, 400) == 400  # no output at all: silent throughout


def test_a_pause_is_how_much_later_than_usual_a_moved_key_groups_result_came():
    times = np.array([1_000, 2_000, 3_000, 3_000])
    groups = np.array([1, 1, 2, 1])
    latency = np.array([300.0, 900.0, 2_500.0, 250.0])  # key group 2 (not moved) was late too
    assert held_up_ms(times, groups, latency, [1], 0, 5_000, usual_ms=300) == 600
    assert held_up_ms(times, groups, latency, [1], 2_500, 5_000, usual_ms=300) == 0  # on time: no pause
    assert held_up_ms(times, groups, latency, [3], 0, 5_000, usual_ms=300) == 0


def test_per_bin_percentiles_and_empty_bins():
    times = np.array([0, 10, 20, 250])
    values = np.array([5.0, 7.0, 100.0, 1.0])
    rows = per_bin(times, values, 0, 300)
    assert [row["samples"] for row in rows] == [3, 0, 1]
    assert rows[0]["max_ms"] == 100.0 and rows[0]["p50_ms"] == 7.0
    assert "p99_ms" not in rows[1]


def test_a_strategy_reports_the_worse_of_scale_out_and_scale_in():
    base = {"max_latency_ms": 10.0, "p99_latency_ms": 8.0, "pause_ms": 100.0, "output_gap_ms": 900.0, "rescale_s": 3.0,
            "handover_ms": 900.0, "bytes_moved": 10}
    measured = {"lost": 0, "duplicated": 0, "correct": True,
                "rescales": [base, {**base, "pause_ms": 300.0, "bytes_moved": 5, "max_latency_ms": None}]}
    figures = summary(measured)
    assert figures["pause_ms"] == 300.0 and figures["bytes_moved"] == 10 and figures["max_latency_ms"] == 10.0
    assert (figures["lost"], figures["duplicated"], figures["correct"]) == (0, 0, True)


def test_drift_is_the_rise_of_the_median_from_the_first_half_to_the_second():
    times = np.array([0, 100, 200, 600, 700, 800, 1_500])
    values = np.array([900.0, 1_000.0, 1_100.0, 2_900.0, 3_000.0, 3_100.0, 99_999.0])  # the last is outside
    assert drift_ms(times, values, 0, 1_000) == 2_000  # falling behind: 1,000 -> 3,000
    assert drift_ms(times, values - np.array([0, 0, 0, 2_000, 2_000, 2_000, 0]), 0, 1_000) == 0
    assert drift_ms(times, values, 1_000, 2_000) is None  # nothing in its first half to compare with
