"""Prometheus metrics of one worker (instance), served on its /metrics.

Busy, idle and backpressured seconds are counted separately so that DS2's true
processing rate (records per busy second) can be computed from them.

A worker runs a chain of operators (chaining.py); every operator of it has its
own series (label `operator`), so metrics show each operator. The head's busy,
idle and batch series are the whole chain's: they are the worker's time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LABELS = ("job", "operator", "instance")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60)


class _Families:
    """The metric families of one worker, each with a child per operator of its chain."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, _LABELS, registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, _LABELS, registry=registry)

        self.records_in = counter("streamjobs_records_in", "Records read by this instance.")
        self.records_out = counter("streamjobs_records_out", "Records written by this instance (per edge).")
        self.busy_seconds = counter("streamjobs_busy_seconds", "Time spent processing batches with data.")
        self.idle_seconds = counter("streamjobs_idle_seconds", "Time spent waiting for input.")
        # Sums over batches from which the autoscaler fits busy = fixed x batches + per_record x records.
        self.batches = counter("streamjobs_batches", "Batches that carried records.")
        self.batch_records_squared = counter("streamjobs_batch_records_squared", "Sum of records^2 per batch.")
        self.batch_records_busy = counter(
            "streamjobs_batch_records_busy_seconds", "Sum of records x busy seconds per batch."
        )
        self.batch_busy_squared = counter(
            "streamjobs_batch_busy_squared_seconds", "Sum of busy seconds^2 per batch (the fit's residual error)."
        )
        self.backpressured_seconds = counter(
            "streamjobs_backpressured_seconds", "Time a producer paused because downstream was over its bound."
        )
        self.late_records = counter("streamjobs_late_records", "Records dropped as later than allowed.")
        self.dead_letters = counter("streamjobs_dead_letters", "Records sent to the dead-letter stream.")
        self.shed_records = counter(
            "streamjobs_shed_records", "Records a source dropped while its backlog was over loadShedding's bound."
        )
        self.batch_duration = Histogram(
            "streamjobs_batch_duration_seconds", "Duration of a micro-batch, read to commit.", _LABELS,
            registry=registry,
        )
        self.latency = Histogram(
            "streamjobs_e2e_latency_seconds", "Event or ingest time to sink commit (sampled per batch).", _LABELS,
            buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.state_bytes = gauge("streamjobs_state_bytes", "Serialized size of this instance's keyed state.")
        self.owned_key_groups = gauge("streamjobs_owned_key_groups", "Key groups this instance owns.")
        self.assignment_epoch = gauge("streamjobs_assignment_epoch", "Epoch of the assignment in force.")
        self.source_pending = gauge(
            "streamjobs_source_pending_records", "Records due at a source and not yet emitted (its backlog)."
        )
        self.watermark = gauge("streamjobs_watermark_ms", "Input watermark (event time, ms).")
        self.lag = Gauge(
            "streamjobs_kg_lag_records", "Records produced into an owned kg stream and not yet consumed.",
            (*_LABELS, "input", "key_group"), registry=registry,
        )


class WorkerMetrics:
    """The series of one operator of the worker's chain."""

    def __init__(self, job: str, op: str, instance: int, registry: CollectorRegistry | None = None,
                 families: _Families | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._families = families or _Families(self.registry)
        self._server = None
        f = self._families
        labels = {"job": job, "operator": op, "instance": str(instance)}
        self.records_in = f.records_in.labels(**labels)
        self.records_out = f.records_out.labels(**labels)
        self.busy_seconds = f.busy_seconds.labels(**labels)
        self.idle_seconds = f.idle_seconds.labels(**labels)
        self.batches = f.batches.labels(**labels)
        self.batch_records_squared = f.batch_records_squared.labels(**labels)
        self.batch_records_busy = f.batch_records_busy.labels(**labels)
        self.batch_busy_squared = f.batch_busy_squared.labels(**labels)
        self.backpressured_seconds = f.backpressured_seconds.labels(**labels)
        self.late_records = f.late_records.labels(**labels)
        self.dead_letters = f.dead_letters.labels(**labels)
        self.shed_records = f.shed_records.labels(**labels)
        self.batch_duration = f.batch_duration.labels(**labels)
        self.latency = f.latency.labels(**labels)
        self.state_bytes = f.state_bytes.labels(**labels)
        self.owned_key_groups = f.owned_key_groups.labels(**labels)
        self.assignment_epoch = f.assignment_epoch.labels(**labels)
        self.source_pending = f.source_pending.labels(**labels)
        self.watermark = f.watermark.labels(**labels)
        self._job, self._instance = job, instance
        self._labels = labels

    def follower(self, op: str) -> WorkerMetrics:
        """The series of another operator of the same chain, on the same registry."""
        return WorkerMetrics(self._job, op, self._instance, self.registry, self._families)

    def count_batch(self, records: int, busy_s: float) -> None:
        self.busy_seconds.inc(busy_s)
        self.batches.inc()
        self.batch_records_squared.inc(records * records)
        self.batch_records_busy.inc(records * busy_s)
        self.batch_busy_squared.inc(busy_s * busy_s)

    def set_lag(self, upstream: str, kg: int, records: int) -> None:
        self._families.lag.labels(**self._labels, input=upstream, key_group=str(kg)).set(records)

    def drop_lag(self, upstream: str, kg: int) -> None:
        """A released key group's lag is its new owner's to report."""
        self._families.lag.remove(*self._labels.values(), upstream, str(kg))

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
