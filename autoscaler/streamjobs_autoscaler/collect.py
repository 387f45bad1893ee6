"""Collect: cumulative counters per operator, from the workers' /metrics or from Prometheus.

A collector returns a `Snapshot` of counters (records, busy and idle seconds)
and gauges (lag, source backlog) summed over an operator's instances; rates
are differences of two snapshots (evaluate.py), so a collector keeps no state.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families
from streamjobs_core.jobstore import JobStore


@dataclass
class OperatorCounters:
    instances: int = 0
    records_in: float = 0.0
    records_out: float = 0.0
    shed: float = 0.0  # records a source dropped (load shedding)
    busy_s: float = 0.0
    idle_s: float = 0.0
    batches: float = 0.0  # batches that carried records, and two sums over them for the cost fit:
    batch_records_sq: float = 0.0  # records^2
    batch_records_busy: float = 0.0  # records x busy seconds
    batch_busy_sq: float = 0.0  # busy seconds^2
    lag: float = 0.0  # records waiting in the operator's kg streams
    pending: float = 0.0  # records due at a source and not yet emitted
    watermark_ms: float = float("inf")
    latency_buckets: dict[float, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    time: float  # the autoscaler clock's seconds
    operators: dict[str, OperatorCounters]


class Collector(Protocol):
    def collect(self, now: float) -> Snapshot: ...


_SUMMED = {
    "streamjobs_records_in_total": "records_in",
    "streamjobs_records_out_total": "records_out",
    "streamjobs_shed_records_total": "shed",
    "streamjobs_busy_seconds_total": "busy_s",
    "streamjobs_idle_seconds_total": "idle_s",
    "streamjobs_batches_total": "batches",
    "streamjobs_batch_records_squared_total": "batch_records_sq",
    "streamjobs_batch_records_busy_seconds_total": "batch_records_busy",
    "streamjobs_batch_busy_squared_seconds_total": "batch_busy_sq",
    "streamjobs_kg_lag_records": "lag",
    "streamjobs_source_pending_records": "pending",
}


def add_exposition(counters: dict[str, OperatorCounters], text: str) -> None:
    """Add one instance's Prometheus text exposition to the counters of each operator it speaks for (a
    worker runs a chain of operators, each with its own series)."""
    seen: set[str] = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            op = s.labels.get("operator")
            if op is None:
                continue
            if op not in seen:
                seen.add(op)
                counters[op].instances += 1
            op_counters = counters[op]
            attribute = _SUMMED.get(s.name)
            if attribute is not None:
                setattr(op_counters, attribute, getattr(op_counters, attribute) + s.value)
            elif s.name == "streamjobs_watermark_ms":
                op_counters.watermark_ms = min(op_counters.watermark_ms, s.value)
            elif s.name == "streamjobs_e2e_latency_seconds_bucket":
                le = float(s.labels["le"])
                op_counters.latency_buckets[le] = op_counters.latency_buckets.get(le, 0.0) + s.value


class EndpointCollector:
    """Scrapes every instance registered in the job store, as Prometheus would.

    The job's workers write where they are, and they run its user code: an address is scraped only if its
    host is one `hosts()` names (on Kubernetes: the job's pods' IPs; None: any), and a reply past
    `max_bytes` (a worker's is some KB) is dropped, so that a job cannot point whoever collects at another
    service nor flood it.
    """

    def __init__(self, store: JobStore, timeout_s: float = 1.0, max_bytes: int = 4 << 20,
                 hosts: Callable[[], set[str]] | None = None) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.hosts = hosts

    def collect(self, now: float) -> Snapshot:
        out: dict[str, OperatorCounters] = defaultdict(OperatorCounters)
        allowed = None if self.hosts is None else self.hosts()
        for address in self.store.registered().values():
            if allowed is not None and address.rpartition(":")[0] not in allowed:
                continue
            try:
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=self.timeout_s) as response:
                    data = response.read(self.max_bytes + 1)
            except OSError:
                continue  # a restarting instance shows up again on the next scrape
            if len(data) <= self.max_bytes:
                add_exposition(out, data.decode(errors="replace"))
        return Snapshot(now, dict(out))


class PrometheusCollector:
    """Asks a Prometheus server for the same sums (instant queries over its latest scrape)."""

    def __init__(self, base_url: str, job: str, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.job = job
        self.timeout_s = timeout_s

    def _query(self, promql: str) -> dict[str, float]:
        url = f"{self.base_url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus query {promql!r} failed: {body.get('error')}")
        return {row["metric"].get("operator", ""): float(row["value"][1]) for row in body["data"]["result"]}

    def collect(self, now: float) -> Snapshot:
        selector = f'{{job="{self.job}"}}'
        out: dict[str, OperatorCounters] = defaultdict(OperatorCounters)
        for metric, attribute in _SUMMED.items():
            for op, value in self._query(f"sum by (operator) ({metric}{selector})").items():
                setattr(out[op], attribute, value)
        for op, value in self._query(f"count by (operator) (streamjobs_records_in_total{selector})").items():
            out[op].instances = int(value)
        for op, value in self._query(f"min by (operator) (streamjobs_watermark_ms{selector})").items():
            out[op].watermark_ms = value
        return Snapshot(now, dict(out))
