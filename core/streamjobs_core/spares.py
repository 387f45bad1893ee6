"""Warm spares: instances-to-be that start Spark and rehearse their chain before anyone needs them.

A fresh worker JVM started while the job runs takes 15-19 s on this project's
2-core machine to be ready (its start competes with the workers it joins) and
its first batches run several times slower than a warm worker's, so a
scale-out's moved key groups wait on it. A spare pays that on idle CPU long
before: `rescale.spareInstances` of them are kept per chain that runs Spark.
The fleet promotes one by pushing a `Promotion` to the list the spare blocks
on; it then runs as that instance (or as a standby of an all_at_once rescale's
epoch). A spare holds no key groups and no offsets until promoted, so killing
one at any time loses nothing. A scale-in demotes the instances it removes to
spares (up to the pool's size): warm from real work, they refill the pool
without a JVM start while the job runs, which on shared cores costs the
running instances' latency for seconds even at the lowest CPU priority.
"""

from __future__ import annotations

import threading

from .control import Promotion
from .jobstore import JobStore

_WAIT_S = 0.5  # how often a waiting spare looks at its stop flag


def await_promotion(store: JobStore, op: str, spare: str, stop: threading.Event) -> Promotion | None:
    """Block until this spare is promoted (what it becomes) or stopped (None)."""
    while not stop.is_set():
        promotion = store.await_promotion(op, spare, _WAIT_S)
        if promotion is not None:
            return promotion
    return None


# --- warm spares of a StatefulSet (the operator's fleet.py) ------------------------------------------------------
# There a pod is its ordinal and cannot be renamed: `spareInstances` pods beyond the parallelism wait as spares
# under their ordinal's name, a scale-out promotes those whose ordinals it adds, a scale-in lets the instances it
# empties become spares again where they are, and a pod restarted takes the role its ordinal has.


def pod_spare(ordinal: int) -> str:
    """The spare name of the pod with this ordinal."""
    return f"pod-{ordinal}"


def serves_as_instance(store: JobStore, op: str, ordinal: int) -> bool:
    """Whether the pod with this ordinal is an instance of `op`: below the parallelism in force, or promoted
    beyond it while a scale-out moves key groups to it (in the epoch still in force)."""
    assignment = store.assignment(op)
    if assignment is None or ordinal < assignment.parallelism:
        return True
    return store.promoted_pod(op, ordinal) == assignment.epoch


def watch_demotion(store: JobStore, op: str, ordinal: int, demote, stop: threading.Event, every_s: float = _WAIT_S) -> None:
    """Until `stop`: call `demote()` once this pod is no longer an instance (a scale-in emptied it). No signal
    reaches a pod from the operator: the pod looks."""
    while not stop.wait(every_s):
        if not serves_as_instance(store, op, ordinal):
            demote()
            return
