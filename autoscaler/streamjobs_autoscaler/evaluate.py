"""Evaluate: pure functions from two snapshots to rates, and from rates to DS2's target parallelism.

DS2 (Kalavri et al., OSDI '18): an instance's *true* processing rate is what it
does per second of useful (busy) time, not per second of wall time; an
operator needs `target input rate / (true rate per instance x utilization)`
instances. A micro-batch also pays a fixed cost (a Spark job's ~0.25 s floor)
that a busier instance spreads over larger batches; counted as per-record time
it would make a lightly loaded instance look slow and DS2 ask for instances
that add nothing. So busy time is fitted as `fixed x batches + per_record x
records` over the window's batches, and the true rate is `1 / per_record`. Target rates start at the sources (what arrives, plus the backlog
to catch up) and flow downstream through each operator's observed
selectivity, so every operator is sized in one decision, before its input
has even grown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from streamjobs_core.spec import AutoscalerSettings

from .collect import OperatorCounters, Snapshot
from .topology import Topology


@dataclass(frozen=True)
class Rates:
    instances: int
    input_per_s: float  # records consumed per wall second (for a source: emitted)
    output_per_s: float  # records written per wall second, all edges
    arrival_per_s: float  # for a source: records falling due per second (emitted + growth of its backlog)
    busy_ratio: float  # busy / (busy + idle), averaged over instances
    true_rate_per_instance: float | None  # records per busy second of one instance; None without busy time
    backlog: float  # source pending or kg lag at the end of the window
    batch_cost_s: float = 0.0  # fitted fixed busy seconds per batch, left out of the true rate


def window_rates(window: Sequence[Snapshot]) -> dict[str, Rates]:
    """Rates over a window of snapshots (oldest first). A source's arrival rate is the larger of the
    window's average and its last interval's: a step up in load shows at once, a step down only
    once the whole window saw it (scaling down late is cheap, scaling up late is not)."""
    first, previous, last = window[0], window[-2], window[-1]
    if last.time <= first.time:
        raise ValueError("a window needs two snapshots at different times")
    rates = {}
    for op, end in last.operators.items():
        start = first.operators.get(op, OperatorCounters())
        dt = last.time - first.time
        records_in = max(0.0, end.records_in - start.records_in)
        busy = max(0.0, end.busy_s - start.busy_s)
        idle = max(0.0, end.idle_s - start.idle_s)
        fit = cost_fit(start, end)
        if fit is not None:
            batch_cost, true_rate = fit[0], 1 / fit[1]
        else:
            batch_cost, true_rate = 0.0, records_in / busy if busy > 0.01 and records_in > 0 else None
        rates[op] = Rates(
            instances=end.instances,
            input_per_s=records_in / dt,
            # Shed records count as output: DS2 sizes the job for the load offered, not for what shedding left.
            output_per_s=max(0.0, end.records_out + end.shed - start.records_out - start.shed) / dt,
            arrival_per_s=max(_arrival(start, end, dt), _arrival(previous.operators.get(op, start), end,
                                                                   last.time - previous.time)),
            busy_ratio=busy / (busy + idle) if busy + idle > 0 else 0.0,
            true_rate_per_instance=true_rate,
            backlog=end.pending + end.lag,
            batch_cost_s=batch_cost,
        )
    return rates


MIN_FIT_BATCHES = 10
MIN_FIT_SPREAD = 0.1  # batch sizes' coefficient of variation below which the two costs cannot be told apart


def cost_fit(start: OperatorCounters, end: OperatorCounters) -> tuple[float, float] | None:
    """(fixed busy seconds per batch, busy seconds per record): least squares over the batches between two
    snapshots, from the sums the workers export. None when there are too few batches, their sizes hardly
    varied, or the fit is not physical (then records / busy is the honest, pessimistic rate)."""
    n = end.batches - start.batches
    if n < MIN_FIT_BATCHES:
        return None
    records = end.records_in - start.records_in
    busy = end.busy_s - start.busy_s
    squares = end.batch_records_sq - start.batch_records_sq
    products = end.batch_records_busy - start.batch_records_busy
    mean = records / n
    variance = squares / n - mean * mean
    if mean <= 0 or variance <= (MIN_FIT_SPREAD * mean) ** 2:
        return None
    per_record = (products / n - mean * busy / n) / variance
    fixed = busy / n - per_record * mean
    if per_record <= 0 or fixed < 0:
        return None
    return fixed, per_record


def _arrival(start: OperatorCounters, end: OperatorCounters, dt: float) -> float:
    """Records that fell due per second: emitted plus the growth of the backlog."""
    return max(0.0, end.records_in - start.records_in + end.pending - start.pending) / dt


@dataclass(frozen=True)
class Target:
    target_rate: float  # records per second the operator must process if it is rescaled
    steady_rate: float  # the same without the input that piles up during a rescale
    true_rate_per_instance: float | None
    parallelism: float | None  # exact (unrounded) instances needed; None when the true rate is unknown
    selectivity: float  # output records per input record and consumer

    def utilization(self, instances: int) -> float | None:
        """Busy share `instances` would run at to keep up (steady rate); None when the true rate is unknown."""
        if not self.true_rate_per_instance:
            return None
        return self.steady_rate / (self.true_rate_per_instance * max(1, instances))


def ds2(topology: Topology, rates: dict[str, Rates], settings: AutoscalerSettings) -> dict[str, Target]:
    """Target rates and needed parallelism of every operator, from sources to sinks in one pass."""
    targets: dict[str, Target] = {}
    catch_up = settings.catch_up_seconds
    for info in topology.operators:
        rate = rates.get(info.name)
        if rate is None:
            continue
        if info.is_source:
            # What arrives and the backlog to catch up; sizing a rescale adds what arrives while it runs.
            steady = rate.arrival_per_s + rate.backlog / catch_up
            target = steady + rate.arrival_per_s * settings.expected_rescale_s / catch_up
        else:
            feeding = [targets[u] for u in info.inputs if u in targets]
            steady = sum(u.steady_rate * u.selectivity for u in feeding) + rate.backlog / catch_up
            target = sum(u.target_rate * u.selectivity for u in feeding) + rate.backlog / catch_up
        selectivity = rate.output_per_s / rate.input_per_s / max(1, info.consumers) if rate.input_per_s > 0 else 1.0
        true_rate = rate.true_rate_per_instance
        needed = target / (true_rate * settings.target_utilization) if true_rate else None
        targets[info.name] = Target(target, steady, true_rate, needed, selectivity)
    return targets


def evenly_spread(parallelism: float, key_groups: int, lowest: int, highest: int) -> tuple[int, bool]:
    """The smallest divisor of key_groups >= parallelism within [lowest, highest]; and whether the bounds
    kept it below what was asked (then the largest divisor allowed)."""
    wanted = max(lowest, math.ceil(parallelism - 1e-9))
    divisors = [d for d in range(1, key_groups + 1) if key_groups % d == 0 and lowest <= d <= highest]
    if not divisors:
        return min(max(wanted, lowest), highest), wanted > highest
    above = [d for d in divisors if d >= wanted]
    if above:
        return above[0], False
    return divisors[-1], True
