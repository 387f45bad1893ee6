"""The JSON report of a local run: committed counts read from the job's exchange, latency, verification."""

from __future__ import annotations

from streamjobs_core.exchange import Exchange
from streamjobs_core.plan import JobPlan


def committed_counts(exchange: Exchange, plan: JobPlan) -> dict[str, dict[str, int]]:
    """Records each operator took and produced, as committed with its batches (restarts do not double
    count); chained operators, which exchange nothing through Redis, count the same way."""
    counts = {k.decode(): int(v) for k, v in exchange.hashes([plan.keys.counts])[0].items()}
    return {name: {"records_in": counts.get(f"{name}:in", 0), "records_out": counts.get(f"{name}:out", 0)}
            for name in plan.spec.topological_order()}


def dead_letter_counts(exchange: Exchange, plan: JobPlan) -> dict[str, int]:
    """Records each operator dead-lettered, all time (the dead-letter stream itself is capped)."""
    totals = {k.decode(): int(v) for k, v in exchange.hashes([plan.keys.dead_letter_totals])[0].items()}
    return {name: totals.get(name, 0) for name in plan.spec.topological_order()}


def sink_counts(exchange: Exchange, plan: JobPlan) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for sink in plan.spec.sinks:
        if sink.type == "redis_stream":
            out[sink.name] = exchange.length([plan.keys.output_stream(sink.name)])[0]
        elif sink.type == "parquet":
            out[sink.name] = len(exchange.items(plan.keys.manifest(sink.name)))  # committed files
        else:
            out[sink.name] = None
    return out
