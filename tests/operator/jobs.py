"""StreamJob documents for the operator tests: a copy job without Spark, and a window count on Spark."""

from __future__ import annotations

from collections import Counter

from streamjobs_core import generators, layout
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.plan import JobPlan
from streamjobs_operator.kube import Kube

NAMESPACE = "default"


def job_id(name: str, namespace: str = NAMESPACE) -> str:
    """The id the operator gives StreamJob `name`'s Redis keys."""
    return layout.job_id(namespace, name)


WORDS = {"name": "words", "type": "zipf", "vocabulary": 50, "rate": {"recordsPerSecond": 150}}


def _streamjob(name: str, spec: dict) -> dict:
    return {"apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"maxParallelism": 12, "sources": [WORDS], **spec}}


def wordcopy(name: str, sink_parallelism: int = 1, sink_cost_us: float = 0.0, **spec) -> dict:
    """Zipf words copied to a Redis stream sink: two operators (not chained), no SparkSession to wait for. With
    `sink_cost_us`, each sink instance copies at most 1e6 / sink_cost_us records per second."""
    return _streamjob(name, {
        # Not chained to the source: two operators, two StatefulSets, each rescaled on its own.
        "sinks": [{"name": "copies", "type": "redis_stream", "inputs": ["words"], "parallelism": sink_parallelism,
                   "simulatedCostUs": sink_cost_us, "chain": False}],
        "batching": {"minIntervalMs": 100, "maxWaitMs": 50},
        **spec,
    })


def window_counts(name: str, parallelism: int = 1, **spec) -> dict:
    """What users apply: zipf words counted per word in 1 s tumbling windows by a Spark stage whose state is
    keyed per key group (snapshots and changelog), results chained into a Redis stream sink."""
    return _streamjob(name, {
        "stages": [{"name": "counts", "type": "window_aggregate", "inputs": ["words"], "keyBy": "word",
                    "parallelism": parallelism, "window": {"type": "tumbling", "sizeMs": 1000},
                    "aggregations": [{"function": "count", "as": "n"}]}],
        "sinks": [{"name": "totals", "type": "redis_stream", "inputs": ["counts"]}],
        "state": {"snapshotEveryBatches": 5},
        **spec,
    })


def tagged_words(name: str, tag: str = "v0") -> dict:
    """Zipf words tagged by a Spark SQL stage chained to the source, copied to a Redis stream sink: the query is
    what a test edits live."""
    return _streamjob(name, {
        "stages": [{"name": "tag", "type": "sql", "inputs": ["words"],
                    "query": f"SELECT word, event_time, '{tag}' AS tag FROM input"}],
        "sinks": [{"name": "copies", "type": "redis_stream", "inputs": ["tag"], "chain": False}],
        "batching": {"minIntervalMs": 100, "maxWaitMs": 50},
    })


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
    committed = RedisJobStore(r, plan.id).partitions(source, range(count))
    parts = [generators.global_indices(p, count, 0, int(progress.cursor) if progress else 0)
             for p, (progress, _) in committed.items()]
    table = generators.generate(spec, plan.t0_ms, np.sort(np.concatenate(parts)))
    return Counter(zip(map(str, table.column("word").to_pylist()), map(str, table.column("event_time").to_pylist())))


def sink_output(r, plan: JobPlan, sink: str) -> Counter:
    rows = Counter()
    for _, fields in r.xrange(plan.keys.output_stream(sink)):
        rows[(fields[b"word"].decode(), fields[b"event_time"].decode())] += 1
    return rows
