"""Warm spares through a job's life: promoted by a scale-out, refilled by a scale-in, promoted again to
replace an instance killed with SIGKILL; the output stays exact."""

from __future__ import annotations

import signal
import time

from rich.console import Console
from streamjobs_core.loading import load_job, parse_job

from .conftest import ROOT, assert_exact


def _job():
    spec = load_job(ROOT / "tests/jobs/wordcount-small.yaml").model_dump(mode="json", by_alias=True)
    spec["metadata"]["name"] = "wordcount-spares"
    spec["spec"]["stages"][0]["parallelism"] = 1
    spec["spec"]["rescale"]["spareInstances"] = 1
    return parse_job(spec)


def test_spares_are_promoted_demoted_and_replace_a_killed_instance(redis_server, tmp_path):
    from streamjobs.run import run_job

    seen: dict[str, object] = {}

    def pid(runtime, index: int) -> int:
        return runtime.processes.instances[("count", index)].process.pid

    def during(runtime, elapsed: float) -> None:
        pool = runtime.processes.spares.pools["count"]
        step = seen.setdefault("step", 0)
        if step == 0 and elapsed >= 4:
            # Started with the job and warm before the sources began.
            seen["ready_at_start"] = runtime.jobs.ready_spares("count") == {pool[0].name}
            spare = pool[0].process.pid
            seen["scale_out"] = runtime.rescale("count", 2, "batched")
            seen["promoted_is_spare"] = pid(runtime, 1) == spare and not runtime.processes.spares.pools["count"]
            seen["step"] = 1
        elif step == 1 and elapsed >= 8:
            runtime.kill("count", 1, signal.SIGKILL)  # the promoted spare; the pool is empty, so a new process replaces it
            seen["step"] = 2
        elif step == 2 and ("count", 1) in runtime.jobs.registered() and elapsed >= 12:
            demoted = pid(runtime, 1)
            seen["scale_in"] = runtime.rescale("count", 1, "batched")
            seen["demoted_is_spare"] = [s.process.pid for s in runtime.processes.spares.pools["count"]] == [demoted]
            seen["step"] = 3
        elif step == 3 and runtime.jobs.ready_spares("count") == {pool[0].name}:
            seen["spare"] = pool[0].process.pid
            killed = runtime.processes.instances[("count", 0)].process
            runtime.kill("count", 0, signal.SIGKILL)
            killed.wait()
            deadline = time.monotonic() + 10
            while pid(runtime, 0) == killed.pid and time.monotonic() < deadline:
                runtime.supervise()  # restarts count/0 from the spare, after restarts.initialBackoffMs
                time.sleep(0.1)
            seen["replaced_by_spare"] = pid(runtime, 0) == seen["spare"]
            seen["out_at_replace"] = runtime.r.xlen(runtime.keys.output_stream("counts"))
            seen["step"] = 4
        elif step == 4 and ("count", 0) in runtime.jobs.registered() and runtime.r.xlen(
                runtime.keys.output_stream("counts")) > seen["out_at_replace"]:
            runtime.request_stop()  # the spare that replaced count/0 works: windows fired since

    report = run_job(_job(), None, redis_url=redis_server.url, console=Console(force_terminal=False),
                     log_dir=str(tmp_path / "logs"), during=during)
    assert seen["step"] == 4, seen
    assert seen["ready_at_start"] and seen["promoted_is_spare"], seen
    assert seen["demoted_is_spare"] and seen["replaced_by_spare"], seen
    assert seen["scale_out"].moved_key_groups == 6 and seen["scale_in"].moved_key_groups == 6
    assert report["spares_promoted"] == 2 and report["restarts"] == 2
    assert_exact(report)
