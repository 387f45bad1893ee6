"""Every example runs with `streamjobs run` and equals the oracle."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest
import redis
from streamjobs_core.loading import load_job
from streamjobs_worker.ports import Ports

from .conftest import ROOT, assert_exact, grown, killer


def worker_processes(job: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"streamjobs_worker" in cmdline and job.encode() in cmdline:
            pids.append(int(proc.name))
    return pids


# Q1's worker is killed once: its Parquet sink wrote the abandoned batch's folder, which no manifest lists.
KILLS = {"examples/nexmark-q1.yaml": [(4, "events", 0)]}


@pytest.mark.parametrize("example", [*(f"examples/nexmark-q{q}.yaml" for q in (1, 2, 3, 4, 6, 7, 8)), "examples/ysb.yaml"])
def test_example_equals_oracle(run_in_process, example):
    kills = killer(KILLS.get(example, []))
    report = run_in_process(example, 8, during=kills)
    assert report["restarts"] >= len(kills.killed) == len(KILLS.get(example, []))
    assert_exact(report)
    assert sum(report["verification"]["sinks"][s]["expected"] for s in report["verification"]["sinks"]) > 0
    source = load_job(ROOT / example).spec.sources[0]
    assert report["operators"][source.name]["records_out"] > 4 * source.rate.records_per_second, \
        "the source ran at its rate"



def test_nexmark_q5_emits_every_auction_at_its_windows_maximum(run_in_process, r):
    """The Q5 example equals the oracle and Q5 as NEXMark defines it, computed here by brute force from the run's
    own input: per 10 s window sliding by 2 s, each auction whose bid count equals the window's highest."""
    from streamjobs.oracle import source_input
    from streamjobs_core.jobstore import RedisJobStore

    report = run_in_process("examples/nexmark-q5.yaml", 8)
    assert_exact(report)
    plan = RedisJobStore(r, "nexmark-q5").plan()
    bids = source_input(Ports.over_redis(r, plan.id), plan, "events").filter(pc.equal(pc.field("event_type"), 2)).to_pandas()
    per_window = Counter()
    for auction, t in zip(bids["bid_auction"], bids["event_time"]):
        last_start = t - t % 2000
        for start in range(last_start, t - 10_000, -2000):  # the five windows [start, start + 10 s) holding t
            per_window[(start + 10_000, auction)] += 1
    highest = Counter()
    for (end, _), count in per_window.items():
        highest[end] = max(highest[end], count)
    want = Counter((auction, count) for (end, auction), count in per_window.items() if count == highest[end])
    got = Counter((int(fields[b"auction"]), int(fields[b"num"]))
                  for _, fields in r.xrange(plan.keys.output_stream("hot-items")))
    assert got == want and len(highest) >= 5

def test_cli_run_stopped_by_sighup_reports_verifies_quietly_and_leaves_no_process(tmp_path):
    """A closed terminal (SIGHUP) stops `streamjobs run` as Ctrl-C does: drained, verified, reported, its
    redis-server and workers gone; the terminal gets a short summary, not JSON or Spark's log lines."""
    report_path = tmp_path / "r.json"
    run = subprocess.Popen(
        [sys.executable, "-m", "streamjobs.cli", "run", str(ROOT / "examples/wordcount.yaml"), "--report",
         str(report_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "250"},  # rich wraps at the width; the path below stays on one line
    )
    started = run.stdout.readline()  # "starting wordcount on redis://127.0.0.1:PORT: workers log to DIR"
    r = redis.Redis.from_url(re.search(r"redis://[0-9.]+:[0-9]+", started).group(0))
    grown(r, "sj:{wordcount}:out:counts", 100, timeout_s=120)  # mid-run: windows fired and more to come
    run.send_signal(signal.SIGHUP)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, started + out[-3000:] + err[-3000:]
    report = json.loads(report_path.read_text())
    assert report["interrupted"] is True
    assert_exact(report)
    assert report["sinks"]["counts"] == report["verification"]["sinks"]["counts"]["expected"] > 0
    assert report["latency_ms"]["p50_ms"] is not None
    assert "verification: correct, lost 0, duplicated 0" in out and f"report: {report_path}" in out
    assert '"operators"' not in out and "WARN" not in out + err and "log4j" not in out + err
    assert worker_processes("wordcount") == []
    with pytest.raises(redis.ConnectionError):
        r.ping()

def test_an_interval_left_join_survives_sigkills_exactly(run_in_process):
    """Both instances of an interval left join are killed: its waiting rows, and which of them met a partner
    (an unmatched one is emitted once its interval passes), come back from the changelog."""
    kills = killer([(6, "early-bids", 0), (10, "early-bids", 1)])
    report = run_in_process("tests/jobs/auctions-bids.yaml", 16, during=kills)
    assert len(kills.killed) == 2 and report["restarts"] >= 2
    sink = report["verification"]["sinks"]["early-bids-out"]
    assert sink["expected"] > 500
    assert_exact(report)
