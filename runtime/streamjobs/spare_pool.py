"""Warm spares of the local runtime: worker processes per chain with Spark up and the chain rehearsed, waiting to
become an instance or a standby (spares.py). A rescale's new instances then start in seconds instead of waiting
for a JVM; an instance a scale-in removes becomes a spare in place, keeping its warm JVM."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from streamjobs_core.control import Promotion
from streamjobs_core.jobstore import JobStore

from .launchers import Launcher

# (log name, chain head, worker arguments, on idle CPU) -> the worker's process
Popen = Callable[[str, str, tuple[str, ...], bool], subprocess.Popen]


@dataclass
class Spare:
    name: str
    process: subprocess.Popen


@dataclass
class SparePool:
    jobs: JobStore
    launcher: Launcher
    popen: Popen
    pools: dict[str, list[Spare]] = field(default_factory=dict)  # per chain, oldest (warmest) first
    promoted: int = 0  # spares that became an instance or a standby
    serial: int = 0

    def fill(self, op: str, wanted: int) -> None:
        """Start spares of `op` until it has `wanted`, on full CPU: the job's first workers start beside them
        and nothing runs yet. While the job runs, only a scale-in refills the pool."""
        pool = self.pools.setdefault(op, [])
        while len(pool) < wanted:
            pool.append(self._new(op, idle_cpu=False))

    def room(self, op: str, wanted: int) -> int:
        return max(0, wanted - len(self.pools.get(op, ())))

    def not_ready(self) -> list[str]:
        """`op/name` of each spare not yet registered ready (Spark up, chain rehearsed)."""
        ready = {op: self.jobs.ready_spares(op) for op in self.pools}
        return [f"{op}/{spare.name}" for op, pool in self.pools.items() for spare in pool if spare.name not in ready[op]]

    def promote(self, op: str, promotion: Promotion) -> subprocess.Popen | None:
        """The oldest live spare of `op`, told what it becomes and back at full priority; None if none is left."""
        pool = self.pools.get(op, [])
        while pool:
            spare = pool.pop(0)
            if spare.process.poll() is not None:
                continue
            self.launcher.full_priority(spare.process)
            self.jobs.promote(op, spare.name, promotion)
            self.promoted += 1
            return spare.process
        return None

    def demote(self, op: str, index: int, process: subprocess.Popen) -> None:
        """Instance `index` of `op` becomes a spare after its current batch, keeping its warm JVM."""
        self.jobs.unregister(op, index)
        name = self._name()
        self.jobs.demote(op, index, name)
        process.send_signal(signal.SIGUSR1)
        self.pools.setdefault(op, []).append(Spare(name, process))

    def replace_dead(self) -> None:
        """A spare that died held nothing (not a worker restart): a new one, on the CPU the job leaves idle."""
        for op, pool in self.pools.items():
            for i, spare in enumerate(pool):
                if spare.process.poll() is not None:
                    pool[i] = self._new(op, idle_cpu=True)

    def stop(self, op: str | None = None) -> None:
        """Kill the spares of `op`, or all."""
        for chain in [op] if op is not None else list(self.pools):
            for spare in self.pools.pop(chain, []):
                spare.process.kill()
                spare.process.wait()

    def _new(self, op: str, idle_cpu: bool) -> Spare:
        name = self._name()
        return Spare(name, self.popen(f"{op}-spare-{name}", op, ("--spare", name), idle_cpu))

    def _name(self) -> str:
        self.serial += 1
        return f"s{self.serial}"
