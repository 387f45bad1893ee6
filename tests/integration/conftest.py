"""A window job's deployed plan in a real Redis, for the rescale controller and handover tests."""

from __future__ import annotations

import pytest
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan, write_assignment

JOB = {
    "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "ctl"},
    "spec": {
        "maxParallelism": 12,
        "sources": [{"name": "src", "type": "zipf"}],
        "stages": [{"name": "agg", "type": "window_aggregate", "inputs": ["src"], "keyBy": "word", "parallelism": 2,
                    "window": {"type": "tumbling", "sizeMs": 1000}, "aggregations": [{"function": "count", "as": "n"}]}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["agg"]}],
    },
}


@pytest.fixture
def plan(r):
    plan = JobPlan(parse_job(JOB), 0)
    for op in plan.spec.operators:
        write_assignment(r, plan.keys, op.name, plan.initial_assignment(op.name))
    return plan
