"""The throughput and nexmark benchmarks' measurements, on small inputs (rates are not asserted: that is the benchmarks' job)."""

from __future__ import annotations

from streamjobs.bench import sss_peer, throughput


def test_ours_is_the_whole_job_measured_from_a_quarter_of_its_input_to_the_end_and_exact(spark):
    from streamjobs.launchers import ThreadLauncher

    result = throughput.measure_ours(60_000, launcher=ThreadLauncher(), max_batch_records=5_000)
    assert 0 < result["records"] <= 45_000  # the first quarter is warm-up
    assert result["records_per_s"] > 0 and result["cpu_s_per_million"] > 0
    assert result["correct"] is True and result["lost"] == 0 and result["duplicated"] == 0


def test_the_peer_is_timed_by_wall_clock_from_its_third_batch(spark):
    result = sss_peer.measure_peer(spark, rows_per_batch=5_000, batches=2, vocabulary=throughput.VOCABULARY)
    assert result["records"] >= 5_000
    assert result["end_s"] > result["start_s"] and result["seconds"] == result["end_s"] - result["start_s"]
    assert result["records_per_s"] == result["records"] / result["seconds"]


def test_a_nexmark_query_is_our_example_run_whole_timed_on_its_source_and_exact(spark):
    from streamjobs.bench import nexmark
    from streamjobs.launchers import ThreadLauncher

    # Enough events that the measured stretch spans several of the CPU clock's 50 ms samples
    result = nexmark.measure_ours("q2", 400_000, launcher=ThreadLauncher())
    assert 0 < result["records"] <= 300_000 and result["records_per_s"] > 0 and result["cpu_s_per_million"] > 0
    assert result["correct"] is True and result["lost"] == 0 and result["duplicated"] == 0
    assert result["t0_ms"] > 1_700_000_000_000  # the origin Flink's copy of the events is generated for
