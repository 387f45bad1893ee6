"""A worker run as a thread (launchers.ThreadLauncher) is handled as a process: it stops when asked, and a kill
abandons it mid-batch as SIGKILL would: it commits nothing more, and a new incarnation goes on exactly."""

from __future__ import annotations

import signal
import time

import redis
from rich.console import Console
from streamjobs.launchers import ThreadLauncher
from streamjobs.run import run_job
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import parse_job


def test_a_killed_thread_worker_commits_nothing_more_and_its_restart_goes_on_exactly(redis_server, tmp_path):
    job = parse_job({"metadata": {"name": "abandoned"}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "words", "type": "zipf", "vocabulary": 50, "rate": {"recordsPerSecond": 30}}],
        # 20 ms per record: a batch is mostly asleep in the sink when the kill comes
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["words"], "chain": False,
                   "simulatedCostUs": 20000}],
        "restarts": {"initialBackoffMs": 4000},  # the abandoned thread has 4 s to commit, and must not
    }})
    r = redis.Redis.from_url(redis_server.url)
    out = JobKeys("abandoned").output_stream("out")
    seen: dict[str, object] = {}

    def during(runtime, elapsed: float) -> None:
        if "killed" not in seen and r.xlen(out) > 20:
            worker = runtime.processes.instances[("out", 0)].process
            worker.kill()
            seen.update(killed=r.xlen(out), status=worker.poll(), worker=worker)
            seen["after"] = []
        elif "killed" in seen and len(seen["after"]) < 6 and ("out", 0) not in runtime.jobs.registered():
            seen["after"].append(r.xlen(out))  # until the new incarnation registers

    report = run_job(job, 10, redis_url=redis_server.url, console=Console(force_terminal=False),
                     log_dir=str(tmp_path / "logs"), during=during, launcher=ThreadLauncher())
    assert seen["status"] == -signal.SIGKILL and report["restarts"] == 1
    assert seen["after"] and set(seen["after"]) == {seen["killed"]}, seen  # nothing committed while it was gone
    time.sleep(0.1)
    assert not seen["worker"]._thread.is_alive()  # it met its cut connection and ended
    assert report["verification"]["correct"] is True, report["verification"]
