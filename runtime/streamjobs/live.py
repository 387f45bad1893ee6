"""The live view of `streamjobs run`: rate, lag, latency and parallelism per operator."""

from __future__ import annotations

import time

import msgpack
import numpy as np
from rich.table import Table
from streamjobs_autoscaler.collect import EndpointCollector, OperatorCounters
from streamjobs_core.exchange import Streams, entry_order
from streamjobs_core.layout import JobKeys
from streamjobs_core.plan import JobPlan
from streamjobs_worker.ports import Ports

_LAST_SEQ = 2**64 - 1  # the largest sequence number of an entry id: an id after every entry of its millisecond


def latency_samples(streams: Streams, keys: JobKeys, since_ms: int = 0, until_ms: int | None = None) -> np.ndarray:
    """The end-to-end latencies sinks sampled, those written from `since_ms` up to `until_ms` (ms since the epoch)."""
    after = None if since_ms <= 0 else f"{since_ms - 1}-{_LAST_SEQ}".encode()
    values: list[int] = []
    for entry_id, fields in streams.after({keys.latency_samples: after})[keys.latency_samples]:
        if until_ms is not None and entry_order(entry_id) > (until_ms, 0):
            break
        values.extend(msgpack.unpackb(fields[b"l"]))
    return np.asarray(values, dtype=np.float64)


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    if not len(values):
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99), "max_ms": float(values.max())}


class LiveView:
    def __init__(self, ports: Ports, plan: JobPlan, parallelism: dict[str, int]) -> None:
        self._exchange = ports.exchange
        self.plan = plan
        self.parallelism = parallelism  # the runtime's, updated by rescales
        self._collector = EndpointCollector(ports.jobs)
        self._previous: dict[str, OperatorCounters] = {}
        self._previous_time = time.monotonic()
        self.started = time.monotonic()

    def rows(self) -> list[dict]:
        now = time.monotonic()
        current = self._collector.collect(now).operators
        dt = max(1e-6, now - self._previous_time)
        recent = latency_samples(self._exchange, self.plan.keys, int(time.time() * 1000) - 5000)
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
