"""The live view of `streamjobs run`: rate, lag, latency and parallelism per operator."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import redis
from rich.table import Table
from streamjobs_autoscaler.collect import EndpointCollector, OperatorCounters
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import JobKeys
from streamjobs_core.plan import JobPlan


def latency_samples(r: redis.Redis, keys: JobKeys, since_ms: int = 0, until_ms: int | None = None) -> np.ndarray:
    values: list[int] = []
    for _, fields in r.xrange(keys.latency_samples, min=f"{since_ms}-0", max=f"{until_ms}-0" if until_ms else "+"):
        values.extend(msgpack.unpackb(fields[b"l"]))
    return np.asarray(values, dtype=np.float64)


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    if not len(values):
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99), "max_ms": float(values.max())}


class LiveView:
    def __init__(self, r: redis.Redis, plan: JobPlan, parallelism: dict[str, int]) -> None:
        self.r = r
        self.plan = plan
        self.parallelism = parallelism  # the runtime's, updated by rescales
        self._collector = EndpointCollector(RedisJobStore(r, plan.id))
        self._previous: dict[str, OperatorCounters] = {}
        self._previous_time = time.monotonic()
        self.started = time.monotonic()

    def rows(self) -> list[dict]:
        now = time.monotonic()
        current = self._collector.collect(now).operators
        dt = max(1e-6, now - self._previous_time)
        recent = latency_samples(self.r, self.plan.keys, int(time.time() * 1000) - 5000)
        latency = percentiles(recent)
        rows = []
        for name in self.plan.spec.topological_order():
            sample = current.get(name, OperatorCounters())
            before = self._previous.get(name, sample)
            busy = sample.busy_s - before.busy_s
            idle = sample.idle_s - before.idle_s
            op = self.plan.spec.operator(name)
            head = self.plan.head(name)  # a chained operator runs in its head's workers
            rows.append({
                "operator": name,
                "chained_to": None if head == name else head,
                # A chain a reconfiguration adds or removes is in the plan a moment before or after it is here.
                "parallelism": f"{sample.instances}/{self.parallelism.get(head, 0)}",
                "in_per_s": max(0.0, (sample.records_in - before.records_in) / dt),
                "out_per_s": max(0.0, (sample.records_out - before.records_out) / dt),
                "lag": sample.lag,
                # A chain's worker time is its head's: a chained operator's share of it is not measured.
                "busy": None if head != name else busy / (busy + idle) if busy + idle > 0 else 0.0,
                "latency": latency if op in self.plan.spec.sinks else None,
            })
        self._previous, self._previous_time = current, now
        return rows

    def render(self, rows: list[dict]) -> Table:
        elapsed = time.monotonic() - self.started
        table = Table(title=f"StreamJob {self.plan.name} — {elapsed:.0f} s")
        for column in ("operator", "instances", "in rec/s", "out rec/s", "lag rec", "busy", "e2e p50 / p99 ms"):
            table.add_column(column, justify="left" if column == "operator" else "right")
        for row in rows:
            latency = row["latency"]
            shown = "" if not latency or latency["p50_ms"] is None else f"{latency['p50_ms']:.0f} / {latency['p99_ms']:.0f}"
            name = row["operator"] if row["chained_to"] is None else f"└ {row['operator']}"
            table.add_row(name, row["parallelism"], f"{row['in_per_s']:.0f}", f"{row['out_per_s']:.0f}",
                          f"{row['lag']:.0f}", "chained" if row["busy"] is None else f"{row['busy']:.0%}", shown)
        return table
