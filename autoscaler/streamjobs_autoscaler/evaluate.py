"""Evaluate: pure functions from two snapshots to rates, and from rates to DS2's target parallelism.

DS2 (Kalavri et al., OSDI '18): an instance's *true* processing rate is what it
does per second of useful (busy) time, not per second of wall time; an
operator needs `target input rate / (true rate per instance x utilization)`
instances. A micro-batch also pays a fixed cost (a Spark job's ~0.25 s floor)
that a busier instance spreads over larger batches; counted as per-record time
it would make a lightly loaded instance look slow and DS2 ask for instances
that add nothing. So busy time is fitted as `fixed x batches + per_record x
records` over the window's batches, and the true rate is `1 / per_record`.
Steady rates start at the sources (what arrives) and flow downstream through
each operator's observed selectivity, so every operator is sized in one
decision, before its input has even grown. Backlogs are not part of the steady
rate: a catch-up rate (the backlogs over catchUpSeconds) says whether the
steady instances' headroom catches them up in time (policies.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

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
    # False when the true rate is a fit on batch sizes too alike to outweigh contention (Fit.lever_error over
    # MAX_LEVER_ERROR): right after a load step a batch or two of the new size carry the fit, and a transient
    # slowdown of them (the cores shared with a source that just sped up) reads as dearer records. A scale-up
    # then waits an interval for larger batches (guards.activation).
    settled: bool = True


def window_rates(window: Sequence[Snapshot], batch_costs: dict[str, float] | None = None) -> dict[str, Rates]:
    """Rates over a window of snapshots (oldest first). A source's arrival rate is the larger of the
    window's average and its last interval's: a step up in load shows at once, a step down only
    once the whole window saw it (scaling down late is cheap, scaling up late is not). `batch_costs`:
    each operator's fixed cost per batch as an earlier window fitted it, used where this one cannot
    tell the costs apart (equal batches under a steady load)."""
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
        known = (batch_costs or {}).get(op, 0.0)
        per_record_busy = busy - (end.batches - start.batches) * known
        if fit is not None:
            batch_cost, true_rate = fit.fixed_s, 1 / fit.per_record_s
        elif known and records_in > 0 and per_record_busy > MIN_PER_RECORD_SHARE * busy:
            batch_cost, true_rate = known, records_in / per_record_busy
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
            settled=fit is None or fit.lever_error <= MAX_LEVER_ERROR,
        )
    return rates


MIN_FIT_BATCHES = 4
# Below this share of busy time left for records once a remembered fixed cost is taken out, that cost no longer
# describes the operator (its batches got cheaper): records / busy is used instead.
MIN_PER_RECORD_SHARE = 0.2
MAX_FIT_ERROR = 0.1  # the per-record cost's standard error, as a share of it, above which the fit is not used
# Batches of one size vary by up to this share of their busy time on shared cores (~10 % measured here, more
# when a neighbour's load changes): not noise that averages out, but a shift of whole groups of batches.
CONTENTION = 0.1
MAX_LEVER_ERROR = 0.25  # a fit that such a shift moves by more than this share of the per-record cost is not settled


class Fit(NamedTuple):
    fixed_s: float  # busy seconds per batch
    per_record_s: float  # busy seconds per record
    # What a CONTENTION shift of the batches' busy times would move per_record_s by, as a share of it: the
    # shift over the spread of batch sizes that must carry it (small when the sizes hardly differ).
    lever_error: float


def cost_fit(start: OperatorCounters, end: OperatorCounters) -> Fit | None:
    """(fixed busy seconds per batch, busy seconds per record): least squares over the batches between two
    snapshots, from the sums the workers export. None when the fit's per-record cost is uncertain (too few
    batches, sizes that hardly varied, scattered busy times) or not physical: then records / busy is the
    honest, pessimistic rate. Judged by its standard error, a fit is used as soon as the data carry it: a
    step in load gives a few batches of a new size, enough to tell the two costs apart before a steady
    window of equal batches could."""
    n = end.batches - start.batches
    if n < MIN_FIT_BATCHES:
        return None
    records = end.records_in - start.records_in
    busy = end.busy_s - start.busy_s
    mean, mean_busy = records / n, busy / n
    variance = (end.batch_records_sq - start.batch_records_sq) / n - mean * mean
    if mean <= 0 or variance <= (1e-6 * mean) ** 2:
        return None
    per_record = ((end.batch_records_busy - start.batch_records_busy) / n - mean * mean_busy) / variance
    fixed = mean_busy - per_record * mean
    if per_record <= 0 or fixed < 0:
        return None
    busy_variance = (end.batch_busy_sq - start.batch_busy_sq) / n - mean_busy * mean_busy
    residual = max(0.0, busy_variance - per_record * per_record * variance) * n / (n - 2)
    if math.sqrt(residual / (n * variance)) > MAX_FIT_ERROR * per_record:
        return None
    return Fit(fixed, per_record, CONTENTION * mean_busy / math.sqrt(variance) / per_record)


def _arrival(start: OperatorCounters, end: OperatorCounters, dt: float) -> float:
    """Records that fell due per second: emitted plus the growth of the backlog."""
    return max(0.0, end.records_in - start.records_in + end.pending - start.pending) / dt


@dataclass(frozen=True)
class Target:
    steady_rate: float  # records per second arriving at the operator once every backlog upstream is gone
    catch_up_rate: float  # the same while it and its upstreams catch their backlogs up within catchUpSeconds
    pile_up_rate: float  # what a rescale would add to that: its own pile-up, caught up within catchUpSeconds
    true_rate_per_instance: float | None
    parallelism: float | None  # exact (unrounded) instances the steady rate needs; None when the true rate is unknown
    selectivity: float  # output records per input record and consumer

    def utilization(self, instances: int) -> float | None:
        """Busy share `instances` would run at to keep up (steady rate); None when the true rate is unknown."""
        if not self.true_rate_per_instance:
            return None
        return self.steady_rate / (self.true_rate_per_instance * max(1, instances))

    def catches_up(self, instances: int, rescaling: bool) -> bool:
        """Whether `instances`, fully busy, drain the backlog within catchUpSeconds (with a rescale's pile-up)."""
        rate = self.catch_up_rate + (self.pile_up_rate if rescaling else 0.0)
        return rate <= (self.true_rate_per_instance or 0.0) * instances


def ds2(topology: Topology, rates: dict[str, Rates], settings: AutoscalerSettings) -> dict[str, Target]:
    """Steady and catch-up rates and the steady parallelism of every operator, from sources to sinks in one
    pass. The steady rate sizes the operator; its backlog (and what a rescale would pile up) is caught up by
    the instances' headroom, or by instances added for the catch-up alone (policies.py)."""
    targets: dict[str, Target] = {}
    horizon = settings.catch_up_seconds
    for info in topology.operators:
        rate = rates.get(info.name)
        if rate is None:
            continue
        if info.is_source:
            steady = catch_up = rate.arrival_per_s
        else:
            feeding = [targets[u] for u in info.inputs if u in targets]
            steady = sum(u.steady_rate * u.selectivity for u in feeding)
            catch_up = sum(u.catch_up_rate * u.selectivity for u in feeding)
        catch_up += rate.backlog / horizon
        selectivity = rate.output_per_s / rate.input_per_s / max(1, info.consumers) if rate.input_per_s > 0 else 1.0
        true_rate = rate.true_rate_per_instance
        # During a live rescale the old instances keep processing: only what they cannot carry piles up
        # (all of it when the strategy stops the job).
        kept = 0.0 if topology.rescale_stops or not true_rate else true_rate * rate.instances
        pile_up = max(0.0, steady - kept) * settings.expected_rescale_s / horizon
        needed = steady / (true_rate * settings.target_utilization) if true_rate else None
        targets[info.name] = Target(steady, catch_up, pile_up, true_rate, needed, selectivity)
    return targets


def balanced(parallelism: float, key_groups: int, lowest: int, highest: int) -> tuple[int, bool]:
    """The fewest instances, within [lowest, highest], of which even the one holding the most key groups
    (ceil(key_groups / n) of them) carries no more than its share of `parallelism` instances' load; and
    whether the bounds kept it below that. 128 key groups need 3 instances (43 each at most) for a need
    of 2.5, not the 4 that a divisor would take; 4 partitions need 4 instances for a need of 3."""
    wanted = max(lowest, math.ceil(parallelism - 1e-9))
    for n in range(wanted, highest + 1):
        if parallelism * math.ceil(key_groups / n) <= key_groups * (1 + 1e-9):
            return n, False
    # Every need up to `key_groups` has a balanced count up to `key_groups`: none within the bounds means the
    # bound (or the key groups themselves) kept it below.
    return max(lowest, min(highest, key_groups)), True
