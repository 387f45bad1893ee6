"""A producer pauses while its output edge holds more unconsumed records than the bound."""

from __future__ import annotations

import time

from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan, write_assignment
from streamjobs_worker.worker import Worker


def test_source_stops_producing_over_the_lag_bound(r):
    bound = 5_000
    job = parse_job({
        "metadata": {"name": "bp"},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "rate": {"recordsPerSecond": 50_000}}],
            "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["words"]}],
            "batching": {"maxLagRecords": bound},
        },
    })
    plan = JobPlan(job, int(time.time() * 1000))
    for op in job.spec.operators:
        write_assignment(r, plan.keys, op.name, plan.initial_assignment(op.name))
    source = Worker(r, plan, "words", 0)
    source.restore()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # nobody consumes: the edge only fills
        source.step()
    produced = sum(int(v) for v in r.hvals(plan.keys.produced("words", "out")))
    offered = 50_000 * (time.time() - plan.t0_ms / 1000)
    assert bound < produced <= bound + 50_000 * 0.25, "at most the batches of one check interval past the bound"
    assert produced < offered / 4
    paused = source.metrics.registry.get_sample_value(
        "streamjobs_backpressured_seconds_total", {"job": "bp", "operator": "words", "instance": "0"}
    )
    assert paused > 1.0
