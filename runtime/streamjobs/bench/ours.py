"""One run of a job of ours in a benchmark: timed by the progress its job store records, CPU counted from /proc.

The run (its runtime, its workers and its oracle) goes in a spawned process of
its own, started while the caller is pinned, so it runs on the same cores; one
oracle JVM verifying run after run in the bench process would carry each run's
heap into the next. A test passes a `launcher` instead, and the run stays in
this process with its workers started by that launcher.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from rich.console import Console
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.spec import StreamJob

from ..redis_server import RedisServer
from ..run import run_job
from .cpus import CpuClock, apart


def measure(job: StreamJob, total: int, progress: Callable[[RedisJobStore], int], launcher=None) -> dict:
    """The run's stretch from a quarter of `total` to all of it, as `progress` reads it off the job store; its
    CPU by process, the oracle's verdict, its dead letters and the event-time origin it ran with (`t0_ms`)."""
    with RedisServer() as server:
        jobs = RedisJobStore(redis.Redis.from_url(server.url), job.metadata.name)
        with CpuClock(lambda: progress(jobs)) as clock:
            if launcher is not None:
                outcome = _run(job, server.url, launcher)
            else:
                outcome = apart(_run, job, server.url)
    stretch = clock.progress_stretch(total)
    return {**stretch.as_dict(), "cpu_by_process": clock.profile(stretch.start, stretch.end), **outcome}


def _run(job: StreamJob, redis_url: str, launcher=None) -> dict:
    t0: list[int] = []

    def during(runtime, _elapsed) -> None:
        if not t0:
            t0.append(runtime.plan.t0_ms)

    report = run_job(job, redis_url=redis_url, console=Console(quiet=True), during=during, launcher=launcher)
    verification = report.get("verification") or {}
    return {**{key: verification.get(key) for key in ("correct", "lost", "duplicated")},
            "verification": verification.get("reason"), "dead_letters": report["dead_letters"],
            "restarts": report["restarts"], "t0_ms": t0[0]}
