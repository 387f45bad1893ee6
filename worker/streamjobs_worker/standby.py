"""A standby: an instance started before a rescale's handover (`--await-epoch E`).

It pays for everything that does not need the key groups yet while the old
owners keep processing (Rhino; Kafka Streams' warm-up replicas): the
SparkSession, and for a stateful operator the state of the key groups the
upcoming assignment gives it: their latest snapshots, then their changelogs,
tailed until the switch. It reports how many changelog entries each catch-up
round applied; the rescale controller starts the handover only when that lag
is small, so the handover itself applies a short delta, whatever the state size.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass

from streamjobs_core.plan import JobPlan
from streamjobs_core.spec import STATEFUL_TYPES
from streamjobs_core.statelog import state_layout

from . import recovery
from .ports import Ports
from .rehearsal import warm_up
from .state import KeyGroupStore, open_store

_CATCH_UP_EVERY_S = 0.25


@dataclass
class Prestaged:
    """The state of the key groups a standby will own, and the last changelog entry applied to each."""

    store: KeyGroupStore
    applied: dict[int, bytes]


def state_directory(plan: JobPlan, op: str, instance: int, epoch: int) -> str:
    # Per epoch: a standby and the old instance with its index run side by side during a rescale.
    root = plan.spec.state.directory or tempfile.gettempdir()
    return os.path.join(root, f"streamjobs-{plan.id.replace('/', '.')}-{op}-{instance}-e{epoch}")


def await_epoch(
    ports: Ports, plan: JobPlan, op: str, instance: int, epoch: int,
    stop: threading.Event,
    warm: bool = False,
) -> tuple[bool, Prestaged | None]:
    """Warm up (unless `warm` already: a promoted spare), then wait until `op`'s assignment reaches `epoch`:
    (whether to run, the prestaged state)."""
    spec = plan.spec.operator(op)
    if not warm:
        warm_up(ports, plan, op)
    jobs, exchange = ports.jobs, ports.exchange
    keys = plan.keys
    prestaged = None
    upcoming = jobs.upcoming_assignment(op)
    if spec.type in STATEFUL_TYPES and upcoming is not None and upcoming.epoch == epoch:
        owned = upcoming.owned_by(instance)
        # Laid out as the stage will bind it: the catch-up applies changes before the stage exists.
        store = open_store(plan.spec.state.backend, owned, state_directory(plan, op, instance, epoch),
                           state_layout(spec))
        prestaged = Prestaged(store, {})
    registered = False
    next_round = 0.0
    while True:
        if prestaged is not None and time.monotonic() >= next_round:
            applied = recovery.catch_up(exchange, keys, op, prestaged.store, prestaged.applied,
                                       prestaged.store.key_groups)
            jobs.report_standby_lag(op, instance, applied)
            next_round = time.monotonic() + _CATCH_UP_EVERY_S
        if not registered:  # ready: Spark is up and the bulk of the state is loaded
            jobs.report_standby(op, instance, epoch)
            registered = True
        assignment = jobs.assignment(op)
        if assignment is not None and assignment.epoch >= epoch:
            return True, prestaged
        if stop.wait(0.05):
            return False, None
