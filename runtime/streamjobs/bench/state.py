"""`streamjobs bench state`: whether a stateful operator's state stays bounded over a long run.

A job (by default NEXMark Q8, whose join buffers persons and sellers) runs at
its own rate for `duration` seconds; every few seconds the operator's durable
state is read from Redis: each key group's snapshot plus its changelog tail,
what recovery restores and a rescale moves. State that expires with the
watermark levels off once the first windows (or intervals, or TTLs) pass; a
leak grows with time. `end_over_2_min` is the state at the end over the state
at minute 2 (the first minutes of a job fill its windows).
"""

from __future__ import annotations

from rich.console import Console
from streamjobs_core.loading import load_job

from ..redis_server import RedisServer
from ..run import run_job
from .rescale import state_bytes

DEFAULT_JOB, DEFAULT_OPERATOR = "examples/nexmark-q8.yaml", "new-users"
SAMPLE_S = 10.0
BASELINE_S = 120.0


class Sampler:
    """`during` hook: the operator's durable state bytes every SAMPLE_S; stops the job at `duration_s`."""

    def __init__(self, operator: str, duration_s: float) -> None:
        self.operator = operator
        self.duration_s = duration_s
        self.samples: list[tuple[float, int]] = []

    def __call__(self, runtime, elapsed: float) -> None:
        if not self.samples or elapsed - self.samples[-1][0] >= SAMPLE_S:
            kgs = list(range(runtime.plan.key_groups(self.operator)))
            self.samples.append((round(elapsed, 1), state_bytes(runtime.r, runtime.keys, kgs, self.operator)))
        if elapsed >= self.duration_s:
            runtime.request_stop()


def run(quick: bool, job_path: str | None = None, operator: str | None = None) -> dict:
    job = load_job(job_path or DEFAULT_JOB)
    operator = operator or DEFAULT_OPERATOR
    duration_s = 240.0 if quick else 600.0
    sampler = Sampler(operator, duration_s)
    with RedisServer() as server:
        report = run_job(job, None, redis_url=server.url, console=Console(force_terminal=False, quiet=True),
                         during=sampler)
    at_baseline = next((b for t, b in sampler.samples if t >= BASELINE_S), None)
    at_end = sampler.samples[-1][1] if sampler.samples else None
    verification = report.get("verification", {})
    return {
        "job": job.metadata.name, "operator": operator, "duration_s": duration_s,
        "bytes_at_2_min": at_baseline, "bytes_at_end": at_end,
        "end_over_2_min": round(at_end / at_baseline, 3) if at_baseline else None,
        "peak_bytes": max((b for _, b in sampler.samples), default=None),
        "records_in": report["operators"][operator]["records_in"],
        "lost": verification.get("lost"), "duplicated": verification.get("duplicated"),
        "correct": verification.get("correct"),
        "samples": [{"t_s": t, "bytes": b} for t, b in sampler.samples],
    }
