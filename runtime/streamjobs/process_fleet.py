"""The rescale and reconfiguration controllers' Fleet port as processes on this machine (operator/fleet.py is
the same port as StatefulSets): which instances of each chain run, started and stopped through the Supervisor.

Start order matters for latency, not for correctness: stages and sinks start
first (each pays ~7 s for its SparkSession), then the event-time origin t0 is
fixed and the generator sources start, so the job does not begin with a
backlog of the warm-up time (sources of external input start with the rest:
their input waits in Redis anyway).
"""

from __future__ import annotations

from collections.abc import Callable

from streamjobs_core.plan import JobPlan

from .supervisor import Supervisor


class ProcessFleet:
    def __init__(self, processes: Supervisor, plan: Callable[[], JobPlan], ready_timeout_s: float = 180.0) -> None:
        self.processes = processes
        self._plan = plan  # the job's plan as it runs now: a reconfiguration replaces it
        self.ready_timeout_s = ready_timeout_s  # for an instance, a standby or a spare to start (and its controllers)
        self.parallelism: dict[str, int] = {}  # per chain, named by its head (chaining.py)

    def start_all(self, before_sources=lambda: None, with_spares: bool = False) -> None:
        """Every chain's instances, `with_spares` each chain's pool of warm spares (`rescale.spareInstances`)."""
        plan = self._plan()
        generated = {s.name for s in plan.job.spec.sources if s.type != "redis_stream"}
        first = [(op, i) for op, n in self.parallelism.items() if op not in generated for i in range(n)]
        then = [(op, i) for op, n in self.parallelism.items() if op in generated for i in range(n)]
        for group in (first, then):
            if group is then:
                before_sources()
            for op, i in group:
                self.processes.spawn(op, i)
            if with_spares and group is first:  # nothing runs yet: spares warm at full speed, with the workers
                for op in plan.vertices:
                    self.processes.spares.fill(op, self._spares_wanted(op))
            self.processes.wait_ready(group, self.ready_timeout_s)
            if with_spares and group is first:
                self.processes.wait_spares(self.ready_timeout_s)

    def _spares_wanted(self, op: str) -> int:
        plan = self._plan()
        return plan.job.spec.rescale.spare_instances if plan.runs_spark(op) else 0

    def _of(self, op: str) -> list[tuple[str, int]]:
        return sorted(k for k in self.processes.instances if k[0] == op)

    def start_standbys(self, op: str, parallelism: int, epoch: int) -> None:
        for i in range(parallelism):
            if (op, i) not in self.processes.standbys:
                self.processes.spawn_standby(op, i, epoch)

    def stop_old(self, op: str, epoch: int) -> None:
        self.processes.stop(self._of(op))

    def adopt(self, op: str, parallelism: int, epoch: int) -> None:
        self.processes.adopt_standbys(op)
        self.parallelism[op] = parallelism
        self.processes.wait_ready([(op, i) for i in range(parallelism)], self.ready_timeout_s)

    def discard_standbys(self, op: str, epoch: int) -> None:
        self.processes.kill_standbys([k for k in self.processes.standbys if k[0] == op])  # one rescale at a time

    def add_instances(self, op: str, parallelism: int) -> None:
        for i in range(parallelism):
            if (op, i) not in self.processes.instances:
                self.processes.spawn(op, i)
        self.processes.wait_ready([(op, i) for i in range(parallelism)], self.ready_timeout_s)

    def remove_instances(self, op: str, parallelism: int) -> None:
        """The instances at `parallelism` and above go: as spares while the pool has room, else stopped."""
        removed = [k for k in self._of(op) if k[1] >= parallelism]
        room = self.processes.spares.room(op, self._spares_wanted(op))
        for key in removed[:room]:
            self.processes.demote(*key)
        self.processes.stop(removed[room:])

    def start_chain(self, op: str, parallelism: int) -> None:
        self.parallelism[op] = parallelism
        self.add_instances(op, parallelism)

    def stop_chain(self, op: str) -> None:
        self.processes.stop(self._of(op))
        self.parallelism.pop(op, None)
        self.processes.spares.stop(op)

    def stop_job(self) -> None:
        self.processes.stop(list(self.processes.instances))

    def start_job(self, parallelism: dict[str, int]) -> None:
        self.parallelism.update(parallelism)
        self.start_all()
