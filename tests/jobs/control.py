"""A window job for the control-plane tests: a zipf source, a 2-instance window stage, a sink; 12 key groups."""

from __future__ import annotations

from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan

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


def control_plan(**rescale) -> JobPlan:
    """The job's plan; `rescale` settings (camelCase) override the spec's."""
    return JobPlan(parse_job({**JOB, "spec": {**JOB["spec"], "rescale": rescale}}), 0)
