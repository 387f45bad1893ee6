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

import json
import threading
from dataclasses import dataclass

from .layout import JobKeys

_WAIT_S = 0.5  # how often a waiting spare looks at its stop flag


@dataclass(frozen=True)
class Promotion:
    instance: int
    await_epoch: int | None = None  # a standby of this epoch (all_at_once), not a running instance

    def encode(self) -> str:
        return json.dumps({"instance": self.instance, "awaitEpoch": self.await_epoch})

    @classmethod
    def decode(cls, raw: str | bytes) -> Promotion:
        fields = json.loads(raw)
        return cls(int(fields["instance"]), fields.get("awaitEpoch"))


def ready(r, keys: JobKeys, op: str, spare: str) -> None:
    r.hset(keys.spares(op), spare, "ready")


def ready_spares(r, keys: JobKeys, op: str) -> set[str]:
    return {s.decode() if isinstance(s, bytes) else s for s in r.hkeys(keys.spares(op))}


def promote(r, keys: JobKeys, op: str, spare: str, promotion: Promotion) -> None:
    pipe = r.pipeline()
    pipe.hdel(keys.spares(op), spare)
    pipe.rpush(keys.promotion(op, spare), promotion.encode())
    pipe.execute()


def demote(r, keys: JobKeys, op: str, instance: int, spare: str) -> None:
    """Name the spare instance `instance` becomes once the fleet's SIGUSR1 stops it (a scale-in)."""
    r.set(keys.demotion(op, instance), spare)


def demoted_as(r, keys: JobKeys, op: str, instance: int) -> str:
    name = r.getdel(keys.demotion(op, instance))
    return name.decode() if isinstance(name, bytes) else name


def await_promotion(r, keys: JobKeys, op: str, spare: str, stop: threading.Event) -> Promotion | None:
    """Block until this spare is promoted (what it becomes) or stopped (None)."""
    while not stop.is_set():
        popped = r.blpop([keys.promotion(op, spare)], timeout=_WAIT_S)
        if popped is not None:
            return Promotion.decode(popped[1])
    return None
