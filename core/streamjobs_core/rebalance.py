"""A skew-aware rebalance: key groups move between an operator's instances by their measured load, not count.

Ranges (and consistent hashing) give every instance as many key groups, but a
skewed key space (Zipf words, hot auctions) puts more records in some key
groups than in others, and an instance that owns the hot ones is the job's
bottleneck while the others idle. The load of a key group is the records its
streams delivered over a measuring window, which with a per-record cost is what
keeps its owner busy. It is measured through the control plane (Chi): a `load`
control event at each end of the window, answered by every instance at its sync
point (controlhandlers.py in the worker).

`balanced` starts from the current owners and repeatedly moves, from the most
loaded instance to the least loaded, the largest key group that narrows their
gap: few key groups move (each move is a handover; one with under 1% of the
load is not worth one), and a key group hotter than a fair share stays where
it is, alone if need be. The move itself is a
rescale to the same parallelism with these owners (rescale.py), batched by
default: key groups change owner at in-band markers while everything runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .control import ControlEvent, ControlRecord
from .jobstore import JobStore
from .keygroups import Assignment
from .plan import JobPlan

_WORTH_MOVING = 0.01  # of the whole load: lighter key groups stay put


@dataclass(frozen=True)
class Balance:
    """Per instance, its share of the measured load now and with the proposed owners."""

    owners: tuple[int, ...]
    load: tuple[float, ...]  # per key group, records per second
    before: tuple[float, ...]  # per instance, share of the load
    after: tuple[float, ...]

    def as_dict(self) -> dict:
        return {"busiest_share_before": max(self.before), "busiest_share_after": max(self.after),
                "shares_before": list(self.before), "shares_after": list(self.after)}


def measure(deliver: Callable[[ControlEvent], ControlRecord], plan: JobPlan, op: str, window_s: float,
            sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
            ) -> tuple[float, ...]:
    """Records per second each key group of `op` read over `window_s`, summed over its inputs: two `load`
    control events `deliver`ed to its instances, each answered at a sync point, so both ends of the window are
    one cut of the stream for every key group alike."""
    if not plan.edges_in(op):
        raise ValueError(f"'{op}' reads no streams: a source's partitions are not rebalanced by load")
    first = _records(deliver(ControlEvent(uuid.uuid4().hex, op, "load", {})), plan.key_groups(op))
    started = clock()
    sleep(window_s)
    last = _records(deliver(ControlEvent(uuid.uuid4().hex, op, "load", {})), plan.key_groups(op))
    elapsed = max(1e-6, clock() - started)
    return tuple((b - a) / elapsed for a, b in zip(first, last))


def measure_committed(store: JobStore, plan: JobPlan, op: str, window_s: float, sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic) -> tuple[float, ...]:
    """As `measure`, from the records each key group's owner committed as consumed: no event travels through
    the job and no plan version is made (a dry run changes nothing), at the price of each window end being
    each owner's last commit rather than one cut."""
    edges = plan.edges_in(op)
    if not edges:
        raise ValueError(f"'{op}' reads no streams: a source's partitions are not rebalanced by load")
    upstreams, kgs = [e.upstream for e in edges], range(plan.key_groups(op))
    first = store.consumed(upstreams, op, kgs)
    started = clock()
    sleep(window_s)
    last = store.consumed(upstreams, op, kgs)
    elapsed = max(1e-6, clock() - started)
    return tuple((last[kg] - first[kg]) / elapsed for kg in kgs)


def _records(record: ControlRecord, key_groups: int) -> list[int]:
    if record.refused:
        raise RuntimeError(f"load event refused: {record.refused}")
    out: dict[int, int] = {}
    for instance, reply in record.replies.items():
        if "error" in reply:
            raise RuntimeError(f"{instance} failed to answer the load event: {reply['error']}")
        out.update({int(kg): int(n) for kg, n in reply["records"].items()})
    missing = sorted(set(range(key_groups)) - out.keys())
    if missing:
        raise RuntimeError(f"no instance answered for key groups {missing}")
    return [out[kg] for kg in range(key_groups)]


def balanced(current: Assignment, load: tuple[float, ...], max_moves: int | None = None) -> Balance:
    """Owners with the busiest instance's load as low as moving whole key groups gets it (see the module)."""
    owners = list(current.owners)
    n = current.parallelism
    totals = [0.0] * n
    for kg, records in enumerate(load):
        totals[owners[kg]] += records
    before = _shares(totals)
    limit = len(owners) if max_moves is None else max_moves
    worth = _WORTH_MOVING * sum(load)  # a handover for less is not worth its pause
    for _ in range(limit):
        busiest = max(range(n), key=totals.__getitem__)
        idlest = min(range(n), key=totals.__getitem__)
        gap = totals[busiest] - totals[idlest]
        # A key group narrows the gap if it carries less than all of it; the largest such one narrows it most.
        fits = [kg for kg, owner in enumerate(owners) if owner == busiest and worth <= load[kg] < gap]
        if not fits:
            break
        kg = max(fits, key=lambda k: load[k])
        owners[kg] = idlest
        totals[busiest] -= load[kg]
        totals[idlest] += load[kg]
    return Balance(tuple(owners), tuple(load), before, _shares(totals))


def _shares(totals: list[float]) -> tuple[float, ...]:
    whole = sum(totals)
    return tuple(round(t / whole, 4) if whole else 0.0 for t in totals)
