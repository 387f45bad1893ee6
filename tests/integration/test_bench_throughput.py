"""The throughput benchmark's two measurements, on small inputs (rates are not asserted: that is the benchmark's job)."""

from __future__ import annotations

from streamjobs.bench import sss_peer, throughput


def test_ours_consumes_the_whole_prefilled_backlog(r, spark):
    plan = throughput._count_job(20_000)
    result = throughput.measure_ours(r, plan)
    consumed = sum(int(v) for v in r.hvals(plan.keys.consumed("words", "count")))
    assert consumed == 20_000
    assert 0 < result["ours_measured_records"] <= 20_000
    assert result["ours_records_per_s"] > 0 and result["redis_bytes_per_record"] > 0


def test_peer_reports_rows_from_progress(spark):
    result = sss_peer.measure_peer(spark, rows_per_batch=5_000, batches=2, vocabulary=throughput.VOCABULARY)
    assert result["peer_measured_records"] >= 5_000
    assert result["peer_records_per_s"] > 0
