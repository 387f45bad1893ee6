"""The JSON report of a local run: committed counts from Redis, latency, verification."""

from __future__ import annotations

import redis
from streamjobs_core.plan import JobPlan


def _hash_total(r: redis.Redis, key: str) -> int:
    return sum(int(v) for v in r.hvals(key))


def committed_counts(r: redis.Redis, plan: JobPlan) -> dict[str, dict[str, int]]:
    """Records each operator consumed and produced, as committed (restarts do not double count)."""
    keys = plan.keys
    counts: dict[str, dict[str, int]] = {}
    for name in plan.spec.topological_order():
        ins = sum(_hash_total(r, keys.consumed(e.upstream, e.downstream)) for e in plan.edges_in(name))
        outs = plan.edges_out(name)
        produced = _hash_total(r, keys.produced(outs[0].upstream, outs[0].downstream)) if outs else 0
        if plan.spec.operator(name) in plan.spec.sources:
            # A generator commits each partition's next index (p<i>); an external stream's source its cursor
            # there and the count of entries it consumed (n<i>).
            counted = b"n" if plan.spec.operator(name).type == "redis_stream" else b"p"
            ins = sum(int(v) for f, v in r.hgetall(keys.offsets(name)).items() if f.startswith(counted))
        counts[name] = {"records_in": ins, "records_out": produced}
    return counts


def sink_counts(r: redis.Redis, plan: JobPlan) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for sink in plan.spec.sinks:
        if sink.type == "redis_stream":
            out[sink.name] = int(r.xlen(plan.keys.output_stream(sink.name)))
        elif sink.type == "parquet":
            out[sink.name] = int(r.llen(plan.keys.manifest(sink.name)))  # committed files
        else:
            out[sink.name] = None
    return out
