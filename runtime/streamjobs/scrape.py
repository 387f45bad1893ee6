"""Reading the workers' /metrics endpoints (the same numbers Prometheus would scrape)."""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

import redis
from prometheus_client.parser import text_string_to_metric_families
from streamjobs_core.layout import JobKeys


@dataclass
class OperatorSample:
    instances: int = 0
    records_in: float = 0.0
    records_out: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    lag: float = 0.0
    watermark_ms: float = float("inf")
    latency_buckets: dict[float, float] = field(default_factory=dict)


def scrape(r: redis.Redis, keys: JobKeys, timeout_s: float = 1.0) -> dict[str, OperatorSample]:
    out: dict[str, OperatorSample] = defaultdict(OperatorSample)
    for name, address in r.hgetall(keys.metrics_endpoints).items():
        op = name.decode().rsplit("/", 1)[0]
        try:
            with urllib.request.urlopen(f"http://{address.decode()}/metrics", timeout=timeout_s) as response:
                text = response.read().decode()
        except OSError:
            continue  # a worker that is restarting shows up again on the next scrape
        sample = out[op]
        sample.instances += 1
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "streamjobs_records_in_total":
                    sample.records_in += s.value
                elif s.name == "streamjobs_records_out_total":
                    sample.records_out += s.value
                elif s.name == "streamjobs_busy_seconds_total":
                    sample.busy_s += s.value
                elif s.name == "streamjobs_idle_seconds_total":
                    sample.idle_s += s.value
                elif s.name == "streamjobs_kg_lag_records":
                    sample.lag += s.value
                elif s.name == "streamjobs_watermark_ms":
                    sample.watermark_ms = min(sample.watermark_ms, s.value)
                elif s.name == "streamjobs_e2e_latency_seconds_bucket":
                    le = float(s.labels["le"])
                    sample.latency_buckets[le] = sample.latency_buckets.get(le, 0.0) + s.value
    return dict(out)
