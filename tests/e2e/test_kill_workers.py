"""SIGKILL of workers mid-stream, restarted by the runtime: still exactly the oracle's result."""

from __future__ import annotations

import signal

from .conftest import assert_exact


def killer(schedule: list[tuple[float, str, int]]):
    pending = sorted(schedule)
    killed: list[str] = []

    def during(runtime, elapsed: float) -> None:
        while pending and pending[0][0] <= elapsed:
            _, op, index = pending.pop(0)
            runtime.kill(op, index, signal.SIGKILL)
            killed.append(f"{op}/{index}")

    during.killed = killed
    return during


def test_window_job_survives_repeated_sigkill(run):
    during = killer([(5, "count", 0), (9, "count", 1), (13, "count", 0), (16, "words", 0), (19, "counts", 0),
                     (22, "count", 0)])
    report = run("examples/wordcount.yaml", 28, during=during)
    assert len(during.killed) == 6
    assert report["restarts"] >= 6
    assert_exact(report)


def test_stateful_user_function_survives_repeated_sigkill(run):
    during = killer([(5, "first-bid", 0), (10, "first-bid", 1), (14, "first-bid", 0), (18, "bids", 0)])
    report = run("tests/jobs/new-bidders.yaml", 24, during=during)
    assert len(during.killed) == 4
    assert_exact(report)
