"""The JSON report of a local run: committed counts from Redis, latency, verification."""

from __future__ import annotations

import redis
from streamjobs_core.plan import JobPlan


def committed_counts(r: redis.Redis, plan: JobPlan) -> dict[str, dict[str, int]]:
    """Records each operator took and produced, as committed with its batches (restarts do not double
    count); chained operators, which exchange nothing through Redis, count the same way."""
    counts = {k.decode(): int(v) for k, v in r.hgetall(plan.keys.counts).items()}
    return {name: {"records_in": counts.get(f"{name}:in", 0), "records_out": counts.get(f"{name}:out", 0)}
            for name in plan.spec.topological_order()}


def dead_letter_counts(r: redis.Redis, plan: JobPlan) -> dict[str, int]:
    """Records each operator dead-lettered, all time (the dead-letter stream itself is capped)."""
    totals = {k.decode(): int(v) for k, v in r.hgetall(plan.keys.dead_letter_totals).items()}
    return {name: totals.get(name, 0) for name in plan.spec.topological_order()}


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
