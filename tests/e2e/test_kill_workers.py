"""SIGKILL of workers mid-stream, restarted by the runtime: still exactly the oracle's result.

(The stateful user function's workers are killed in test_rescale.py, before a rescale of them.)"""

from __future__ import annotations

from .conftest import assert_exact, killer


def test_window_job_survives_repeated_sigkill(run):
    during = killer([(5, "count", 0), (9, "count", 1), (13, "count", 0), (16, "words", 0), (19, "counts", 0),
                     (22, "count", 0)])
    report = run("examples/wordcount.yaml", 28, during=during)
    assert len(during.killed) == 6
    assert report["restarts"] >= 6
    assert_exact(report)
