"""The ds2 autoscaler sizes an overloaded stage live, through the rescale controller, and the result stays exact."""

from __future__ import annotations

import signal

from .conftest import assert_exact


def test_ds2_scales_out_an_overloaded_stage_live_with_an_exact_result(run_in_process):
    killed, rescaled = [], []

    def during(runtime, elapsed: float) -> None:
        if elapsed > 6 and not killed:  # a crash before the decision: the autoscaler must not mistake it
            runtime.kill("count", 0, signal.SIGKILL)
            killed.append(elapsed)
        if runtime.parallelism["count"] > 1 and not rescaled:
            rescaled.append(elapsed)
        if rescaled and elapsed > rescaled[0] + 8:  # the scaled-out stage at work a while
            runtime.request_stop()

    report = run_in_process("tests/jobs/autoscaled.yaml", 150, during=during)
    decisions = [d for d in report["autoscaler"]["decisions"] if d.get("executed")]
    assert decisions, report["autoscaler"]
    first = next(o for o in decisions[0]["operators"] if o["operator"] == "count")
    # 1,500 rec/s at <= 1,000 rec/s per busy second and 70 % target utilization needs at least 3.
    assert first["current"] == 1 and first["parallelism"] >= 3, first["why"]
    assert first["true_rate_per_instance"] < 1000
    assert report["rescales"][0]["strategy"] == "all_at_once" and report["rescales"][0]["operator"] == "count"
    assert report["autoscaler"]["final_parallelism"]["count"] >= 3
    assert report["restarts"] >= 1
    assert_exact(report)
