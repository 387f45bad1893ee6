"""The Flink peer's logic without Flink: the SQL it builds, what it reads from print sinks, its install check."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from streamjobs.bench import flink_peer
from streamjobs.bench.flink import session, sql
from streamjobs.bench.sss_peer import Q5Shape

pytestmark = pytest.mark.unit

Q5 = Q5Shape(size_ms=4000, slide_ms=1000, max_window_ms=1000, active_auctions=200, hot_auction_ratio=0.5,
             out_of_order_ms=100)


def _options(statement: str) -> dict[str, str]:
    """A CREATE TABLE's WITH options."""
    return dict(re.findall(r"'([^']+)' = '([^']*)'", statement.split(") WITH (", 1)[1]))


def _ms(text: str) -> int:
    return sql.epoch_ms(text)


# --- throughput ---------------------------------------------------------------


def test_throughput_source_is_the_sss_peers_rows_unpaced():
    source = sql.throughput_job(5_000_000, 1000).ddl[0]
    assert _options(source) == {
        "connector": "datagen", "rows-per-second": str(sql.UNPACED_ROWS_PER_S),
        "fields.v.kind": "sequence", "fields.v.start": "0", "fields.v.end": "4999999",
    }
    assert "CONCAT('w', CAST(MOD(v, 1000) AS STRING))" in source
    assert "TO_TIMESTAMP_LTZ(v * 1000 / 200000, 3)" in source  # 200k rows per second of event time
    assert "WATERMARK FOR event_time AS event_time - INTERVAL '0.200' SECOND" in source


def test_throughput_counts_per_word_and_second_into_a_blackhole_and_probes_one_word():
    job = sql.throughput_job(1000, 7)
    view = next(s for s in job.ddl if s.startswith("CREATE TEMPORARY VIEW counts"))
    assert "TUMBLE(TABLE words, DESCRIPTOR(event_time), INTERVAL '1' SECOND)" in view
    assert "GROUP BY word, window_start, window_end" in view
    assert _options(next(s for s in job.ddl if "counts_sink" in s)) == {"connector": "blackhole"}
    assert _options(next(s for s in job.ddl if "progress" in s)) == {
        "connector": "print", "print-identifier": sql.PRINT_ID}
    to_blackhole, probe = job.inserts
    assert to_blackhole.startswith("INSERT INTO counts_sink") and "WHERE" not in to_blackhole
    # The probe's filter must read the count: a filter on the word alone would be pushed below the aggregation.
    assert "CAST(n AS STRING)" in probe and "'w0@%'" in probe


@pytest.mark.parametrize(("records", "vocabulary"), [(0, 1000), (10, 0)])
def test_throughput_rejects_empty_input(records, vocabulary):
    with pytest.raises(ValueError, match="must be >= 1"):
        sql.throughput_job(records, vocabulary)


def test_steady_rate_leaves_out_the_start_and_the_windows_fired_at_end_of_input():
    records = 20 * sql.THROUGHPUT_ROWS_PER_EVENT_S  # event time 0 .. 20 s
    firings = [(1000, 9_000), (2000, 9_900)]  # a slow start: JIT, the first windows
    # Then one window (200k rows) every 0.5 s of wall time: 400k rows/s ...
    firings += [(end, 10_000 + (end - 3000) // 2) for end in range(3000, 19_001, 1000)]
    firings += [(20_000, 18_100)]  # ... and the last, fired at once by the end of input
    rate = sql.steady_rate(reversed(firings), records, skip_fraction=0.25)
    assert rate.records_per_s == pytest.approx(400_000)
    # Paced windows end at 1..19 s; the first 4 (25%) are left out: 5 s .. 19 s of event time.
    assert rate.records == 14 * sql.THROUGHPUT_ROWS_PER_EVENT_S
    assert rate.seconds == pytest.approx(7.0)
    assert (rate.start_ms, rate.end_ms) == (11_000, 18_000)  # the wall times its CPU is read between


def test_steady_rate_needs_two_windows_to_time():
    with pytest.raises(ValueError, match="too few to time"):
        sql.steady_rate([(1000, 5000), (2000, 5500)], records=2 * sql.THROUGHPUT_ROWS_PER_EVENT_S)


# --- latency: NEXMark Q5 --------------------------------------------------------


def test_q5_events_are_paced_one_by_one_with_our_disorder():
    job = sql.q5_job(Q5, 1999.6, t0_s=1_700_000_000, rows=90_000)
    assert job.paced == sql.PacedSource(
        view="ticks", rows_per_s=1999.6, rows=90_000,
        event_time="CURRENT_TIMESTAMP - RAND_INTEGER(101) * INTERVAL '0.001' SECOND",  # 0..100 ms of disorder
        watermark="event_time - INTERVAL '0.100' SECOND",  # the watermark delay is the disorder bound
    )
    assert "FROM ticks" in job.ddl[0]


def test_q5_bids_follow_our_nexmark_mix():
    events, bids, per_auction, sink = sql.q5_job(Q5, 2000, t0_s=1_700_000_000, rows=1).ddl
    assert "RAND_INTEGER(50) AS phase" in events and "WHERE phase >= 4" in bids  # 46 of 50 events are bids
    assert "RAND_INTEGER(200) AS pick" in events  # cold bids: one of the 200 newest auctions
    assert "hot < 500" in bids and "newest / 100 * 100" in bids  # half go to the newest multiple of 100
    assert "* 6000 / 50000" in bids  # auction ids advance at 3/50 of 2,000 events/s
    assert "TO_TIMESTAMP_LTZ(1700000000, 0)" in bids
    assert "HOP(TABLE bids, DESCRIPTOR(event_time), INTERVAL '1.000' SECOND, INTERVAL '4.000' SECOND)" in per_auction
    assert _options(sink)["connector"] == "print"


def test_q5_joins_the_counts_with_the_max_per_sliding_window_end_and_stamps_them():
    (insert,) = sql.q5_job(Q5, 2000, t0_s=0, rows=1).inserts
    assert "TUMBLE(TABLE bids_per_auction, DESCRIPTOR(slide_time), INTERVAL '1.000' SECOND)" in insert
    assert "SELECT A.slide_end, A.bid_auction, A.bids, CURRENT_TIMESTAMP" in insert
    assert "ON A.slide_end = M.max_end AND A.bids >= M.maxn" in insert


def test_q5_hot_stride_stays_within_few_active_auctions():
    few = Q5Shape(size_ms=4000, slide_ms=1000, max_window_ms=1000, active_auctions=40, hot_auction_ratio=0.25,
                  out_of_order_ms=0)
    job = sql.q5_job(few, 500, t0_s=0, rows=1)
    assert "newest / 40 * 40" in job.ddl[1] and "hot < 250" in job.ddl[1]
    assert "RAND_INTEGER(1) *" in job.paced.event_time  # no disorder


@pytest.mark.parametrize(("rate", "rows", "error"), [(0.4, 10, "rate must be >= 1"), (2000, 0, "rows in"),
                                                     (2000, 2**31, "rows in")])
def test_q5_rejects_a_rate_or_size_flink_cannot_run(rate, rows, error):
    with pytest.raises(ValueError, match=error):
        sql.q5_job(Q5, rate, t0_s=0, rows=rows)


def test_q5_latency_is_emission_minus_window_end_in_the_measured_half():
    lines = [
        "streamjobs> +I[2026-11-23T18:00:01, 1000, 700, 2026-11-23T18:00:01.450Z]",  # before the measured half
        "streamjobs> +I[2026-11-23T18:00:02, 1000, 712, 2026-11-23T18:00:02.300Z]",
        "streamjobs> +I[2026-11-23T18:00:03, 1100, 690, 2026-11-23T18:00:03.812Z]",
    ]
    since = _ms("2026-11-23T18:00:02Z")
    assert sql.q5_latencies_ms(sql.print_rows(lines), since) == [300, 812]


# --- restart ----------------------------------------------------------------------


def test_restart_windows_end_at_the_chosen_instant():
    fire_at = _ms("2026-11-23T18:00:42.250Z")
    source, sink = sql.restart_job(150_000, 60_000, fire_at).ddl
    assert _options(source) == {
        "connector": "datagen", "rows-per-second": "60000",
        "fields.k.min": "0", "fields.k.max": "149999", "fields.event_time.max-past": "0 ms",
    }
    (insert,) = sql.restart_job(150_000, 60_000, fire_at).inserts
    assert "INTERVAL '60.000' SECOND, INTERVAL '42.250' SECOND" in insert  # size 60 s, offset: ends at :42.250
    # ~1000 printed rows per window, chosen by the count so that the filter stays above the aggregation.
    assert "WHERE MOD(k + n, 150) = 0" in insert


def test_restart_prints_every_row_of_few_keys():
    (insert,) = sql.restart_job(10, 100, 0).inserts
    assert "MOD(k + n, 1) = 0" in insert


@pytest.mark.parametrize(("not_before", "expected"), [(0, 90_000), (90_000, 90_000), (90_001, 150_000),
                                                      (200_000, 210_000)])
def test_next_window_end_steps_by_whole_windows(not_before, expected):
    assert sql.next_window_end_ms(90_000, not_before) == expected


def test_first_output_is_the_earliest_row_of_that_window():
    rows = sql.print_rows([
        "streamjobs:1> +I[7, 2026-11-23T18:00:00, 3, 2026-11-23T18:00:00.100Z]",  # an earlier window
        "streamjobs:2> +I[9, 2026-11-23T18:01:00, 3, 2026-11-23T18:01:02.900Z]",
        "streamjobs:1> +I[4, 2026-11-23T18:01:00, 2, 2026-11-23T18:01:02.750Z]",
    ])
    assert sql.first_output_ms(rows, _ms("2026-11-23T18:01:00Z")) == _ms("2026-11-23T18:01:02.750Z")
    assert sql.first_output_ms(rows, _ms("2026-11-23T18:02:00Z")) is None


# --- print sink output ------------------------------------------------------------


def test_print_rows_keeps_only_our_sinks_inserts():
    lines = ["streamjobs> +I[a, 1]\n", "streamjobs:3> +I[b, 2]", "SLF4J: a JVM line", "other> +I[c, 3]", ""]
    assert sql.print_rows(lines) == [["a", "1"], ["b", "2"]]


def test_print_rows_rejects_a_retraction():
    with pytest.raises(ValueError, match="not an insert row"):
        sql.print_rows(["streamjobs> -U[a, 1]"])


@pytest.mark.parametrize(("text", "expected"), [
    ("1970-01-01T00:00:01.250Z", 1250),  # TIMESTAMP_LTZ
    ("1970-01-01T00:00:01.250", 1250),  # TIMESTAMP, printed in the session's zone: UTC
    ("1970-01-01T00:00:02Z", 2000),  # Java leaves out a zero fraction ...
    ("1970-01-01T00:01", 60_000),  # ... and zero seconds
])
def test_epoch_ms(text, expected):
    assert sql.epoch_ms(text) == expected


# --- the extra and the JVM's cores --------------------------------------------------


def test_a_missing_extra_names_the_install_command(monkeypatch):
    monkeypatch.setattr(session, "_pyflink_folders", lambda: [])
    assert not flink_peer.installed()
    for call in (lambda: flink_peer.measure_throughput(1000), lambda: flink_peer.measure_latency(2000, 10, Q5),
                 lambda: flink_peer.measure_restart(10, 2, 4)):
        with pytest.raises(flink_peer.FlinkNotInstalled, match=re.escape("pip install 'streamjobs[bench]'")):
            call()


def test_flink_lib_is_the_folder_holding_flink_dist(tmp_path):
    (tmp_path / "empty" / "lib").mkdir(parents=True)
    (tmp_path / "full" / "lib").mkdir(parents=True)
    (tmp_path / "full" / "lib" / "flink-dist-2.3.0.jar").touch()
    assert session.flink_lib([str(tmp_path / "empty"), str(tmp_path / "full")]) == tmp_path / "full" / "lib"
    with pytest.raises(session.FlinkNotInstalled):
        session.flink_lib([str(tmp_path / "empty")])


def test_processes_started_while_pinned_run_on_those_cores_only():
    allowed = sorted(os.sched_getaffinity(0))
    with session._pinned(1):
        child = subprocess.Popen(["sleep", "5"])
    try:
        assert os.sched_getaffinity(child.pid) == {allowed[0]}
        assert sorted(os.sched_getaffinity(0)) == allowed  # this thread is unpinned again
    finally:
        child.kill()
        child.wait()


def test_pinning_to_more_cores_than_allowed_is_refused():
    with pytest.raises(ValueError, match="cores must be in"):
        with session._pinned(len(os.sched_getaffinity(0)) + 1):
            pass
