"""StreamJob documents for the operator tests: no Spark (a generator source and a Redis sink)."""

from __future__ import annotations

from collections import Counter

from streamjobs_core import generators
from streamjobs_core.plan import JobPlan
from streamjobs_operator.kube import Kube

NAMESPACE = "default"


def wordcopy(name: str, sink_parallelism: int = 1, sink_cost_us: float = 0.0, **spec) -> dict:
    """Zipf words copied to a Redis stream sink: two operators (not chained), no SparkSession to wait for. With
    `sink_cost_us`, each sink instance copies at most 1e6 / sink_cost_us records per second."""
    return {
        "apiVersion": "streamjobs.dev/v1alpha1",
        "kind": "StreamJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "maxParallelism": 12,
            "sources": [{"name": "words", "type": "zipf", "vocabulary": 50,
                         "rate": {"recordsPerSecond": 150}}],
            # Not chained to the source: two operators, two StatefulSets, each rescaled on its own.
            "sinks": [{"name": "copies", "type": "redis_stream", "inputs": ["words"], "parallelism": sink_parallelism,
                       "simulatedCostUs": sink_cost_us, "chain": False}],
            "batching": {"minIntervalMs": 100, "maxWaitMs": 50},
            **spec,
        },
    }


def apply(kube: Kube, doc: dict) -> dict:
    """`kubectl create -f`: the emulator gives it a uid, as the API server would."""
    return kube.ensure("streamjobs", doc)


def get(kube: Kube, name: str) -> dict:
    return kube.get("streamjobs", NAMESPACE, name) or {}


def phase(kube: Kube, name: str) -> str | None:
    return (get(kube, name).get("status") or {}).get("phase")


def committed_input(r, plan: JobPlan, source: str) -> Counter:
    """The records a generator source committed, regenerated from its offsets (as the oracle does)."""
    import numpy as np

    spec = plan.spec.operator(source)
    count = plan.key_groups(source)
    offsets = r.hgetall(plan.keys.offsets(source))
    parts = [generators.global_indices(p, count, 0, int(offsets.get(f"p{p}".encode(), 0))) for p in range(count)]
    table = generators.generate(spec, plan.t0_ms, np.sort(np.concatenate(parts)))
    return Counter(zip(map(str, table.column("word").to_pylist()), map(str, table.column("event_time").to_pylist())))


def sink_output(r, plan: JobPlan, sink: str) -> Counter:
    rows = Counter()
    for _, fields in r.xrange(plan.keys.output_stream(sink)):
        rows[(fields[b"word"].decode(), fields[b"event_time"].decode())] += 1
    return rows
