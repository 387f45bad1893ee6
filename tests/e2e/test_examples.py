"""Every example runs with `streamjobs run` and equals the oracle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, assert_exact


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


@pytest.mark.parametrize("example", ["examples/nexmark-q1.yaml", "examples/nexmark-q2.yaml", "examples/nexmark-q5.yaml"])
def test_example_equals_oracle(run, example):
    report = run(example, 12)
    assert_exact(report)
    assert sum(report["verification"]["sinks"][s]["expected"] for s in report["verification"]["sinks"]) > 0
    assert report["operators"]["events"]["records_out"] > 20_000, "the source ran at its rate (3,000 records/s)"


def test_cli_run_reports_verifies_and_leaves_no_process(tmp_path):
    report_path = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "streamjobs.cli", "run", str(ROOT / "examples/wordcount.yaml"), "--duration", "10",
         "--report", str(report_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert_exact(report)
    assert report["sinks"]["counts"] == report["verification"]["sinks"]["counts"]["expected"] > 0
    assert report["latency_ms"]["p50_ms"] is not None
    assert worker_processes("wordcount") == []
