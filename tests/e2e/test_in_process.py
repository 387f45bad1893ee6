"""A whole job in one process (launchers.ThreadLauncher): three operators of two instances each go through a kill,
a live rescale and a live reconfiguration, and the output is exact against the oracle. The harness is what
the tests of a job's semantics run on; this test shows it carries all of them at once, over the redis-server
and over memory (the job's store and exchange in this process: no Redis at all)."""

from __future__ import annotations

import signal
import time

import pytest
from streamjobs_core.loading import load_job

from .conftest import ROOT, assert_exact


@pytest.mark.parametrize("underneath", ["redis", "memory"])
def test_a_job_in_threads_goes_through_a_kill_a_rescale_and_a_reconfiguration_exactly(underneath, run_in_process):
    done: dict[str, object] = {}

    def during(runtime, elapsed: float) -> None:
        if elapsed >= 4 and "killed" not in done:
            runtime.kill("tag", 1, signal.SIGKILL)  # mid-stream: its batch in flight is abandoned
            done["killed"] = runtime.processes.instances[("tag", 1)].process.poll()
        elif elapsed >= 6 and "rescaled" not in done:
            done["rescaled"] = runtime.rescale("count", 3, "batched")
        elif "rescaled" in done and "reconfigured" not in done:
            done["reconfigured"] = runtime.reconfigure(load_job(ROOT / "tests/jobs/reconfigured-v1.yaml"))
            done["at"] = elapsed
        elif "at" in done and elapsed >= done["at"] + 4:
            runtime.request_stop()

    started = time.monotonic()
    report = run_in_process("tests/jobs/reconfigured.yaml", None, memory=underneath == "memory", during=during)
    assert time.monotonic() - started < 60
    assert done["killed"] == -signal.SIGKILL and report["restarts"] == 1
    assert (done["rescaled"].from_parallelism, done["rescaled"].to_parallelism) == (2, 3)
    assert done["reconfigured"].version == 1 and not done["reconfigured"].refused
    assert [r["version"] for r in report["reconfigurations"]] == [1]
    assert report["autoscaler"]["final_parallelism"]["count"] == 3
    assert_exact(report)  # the oracle replays each record under the plan version in force at its offset
    assert all(sink["expected"] > 0 for sink in report["verification"]["sinks"].values())
