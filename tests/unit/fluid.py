"""A fluid model of a job for autoscaler tests: a source, a stage with a known true rate per instance
and a sink, advanced by an injected clock. It produces the same counters the workers export."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamjobs_autoscaler.collect import OperatorCounters, Snapshot
from streamjobs_autoscaler.topology import OperatorInfo, Topology

TOPOLOGY = Topology((
    OperatorInfo("src", (), 1, 120, True),
    OperatorInfo("stage", ("src",), 1, 120, False),
    OperatorInfo("sink", ("stage",), 0, 120, False),
))


@dataclass
class FluidJob:
    rate: float  # records arriving per second at the source
    true_rate: float = 1000.0  # the stage's records per busy second per instance
    selectivity: float = 1.0
    # A fixed busy cost per batch (Spark's floor), paid by up to `batches_per_s` batches of each instance,
    # half of them half and half of them one and a half times the average size.
    batch_cost_s: float = 0.0
    batches_per_s: float = 2.0
    # When scaling does not add capacity (a shared bottleneck), the true rate per instance shrinks.
    capacity_cap: float | None = None
    now: float = 0.0
    parallelism: dict[str, int] = field(default_factory=lambda: {"src": 1, "stage": 1, "sink": 1})
    counters: dict[str, OperatorCounters] = field(default_factory=dict)
    rescales: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counters = {op: OperatorCounters() for op in self.parallelism}

    def clock(self) -> float:
        return self.now

    def stage_rate_per_instance(self) -> float:
        n = self.parallelism["stage"]
        if self.capacity_cap is not None:
            return min(self.true_rate, self.capacity_cap / n)
        return self.true_rate

    def advance(self, seconds: float, dt: float = 1.0) -> None:
        for _ in range(int(seconds / dt)):
            self.now += dt
            src, stage, sink = (self.counters[op] for op in ("src", "stage", "sink"))
            arrived = self.rate * dt
            src.records_in += arrived
            src.records_out += arrived
            src.busy_s += arrived / 1e6
            src.idle_s += dt - arrived / 1e6
            per_instance = self.stage_rate_per_instance()
            n = self.parallelism["stage"]
            batches = n * self._batches_per_s(stage.lag + arrived, n * per_instance * dt) * dt
            fixed = batches * self.batch_cost_s
            processed = min(stage.lag + arrived, (n * dt - fixed) * per_instance)
            busy = fixed + processed / per_instance
            stage.lag += arrived - processed
            stage.records_in += processed
            stage.records_out += processed * self.selectivity
            stage.busy_s += busy
            stage.idle_s += n * dt - busy
            if processed:
                squares = batches * (processed / batches) ** 2 * (0.5**2 + 1.5**2) / 2
                stage.batches += batches
                stage.batch_records_sq += squares
                stage.batch_records_busy += self.batch_cost_s * processed + squares / per_instance
                stage.batch_busy_sq += (batches * self.batch_cost_s**2 + 2 * self.batch_cost_s * processed / per_instance
                                        + squares / per_instance**2)
            out = processed * self.selectivity
            sink.records_in += out
            sink.busy_s += out / 1e6
            sink.idle_s += dt - out / 1e6

    def _batches_per_s(self, offered: float, capacity: float) -> float:
        """Under load an instance's batches grow and come less often: at busy share rho of per-record time,
        a batch lasts fixed / (1 - rho)."""
        if not self.batch_cost_s:
            return self.batches_per_s
        rho = min(0.95, offered / capacity)
        return min(self.batches_per_s, (1 - rho) / self.batch_cost_s)

    # --- ports -----------------------------------------------------------------

    def collect(self, now: float) -> Snapshot:
        return Snapshot(now, {op: OperatorCounters(**{**vars(c), "instances": self.parallelism[op],
                                                        "latency_buckets": {}})
                              for op, c in self.counters.items()})

    def rescale(self, op: str, parallelism: int) -> dict:
        self.parallelism[op] = parallelism
        self.rescales.append((op, parallelism))
        return {"operator": op, "to": parallelism}


class RecordingEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))
