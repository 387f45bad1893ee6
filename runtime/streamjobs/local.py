"""The local runtime: one OS process per instance of each chain of operators, supervised.

The job's processes are the Supervisor's (supervisor.py: start, restart, stop;
its warm spares in spare_pool.py), what runs of each chain is the Fleet's
(process_fleet.py, the port the rescale and reconfiguration controllers drive);
here is what a run does with them: start, resume or restore a job, carry out
the requests `streamjobs rescale|reconfigure|control` leave in Redis, drain.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from streamjobs_core.connect import connect, redacted
from streamjobs_core.control import (
    ControlEvent,
    ControlRecord,
    ReconfigureRecord,
    RescaleRecord,
    RescaleState,
    Strategy,
)
from streamjobs_core.layout import JobKeys
from streamjobs_core.plan import JobPlan
from streamjobs_core.reconfigure import ReconfigureController, Refused, diff
from streamjobs_core.rescale import RescaleController
from streamjobs_core.savepoint import Savepoint, check, read_restore_from, restore
from streamjobs_core.spec import StreamJob
from streamjobs_worker.ports import Ports

from .launchers import Launcher, ProcessLauncher
from .process_fleet import ProcessFleet
from .supervisor import Supervisor


class PreviousRun(RuntimeError):
    """The job's earlier run in this Redis cannot go on; the message says why and what to do."""


@dataclass
class LocalRuntime:
    job: StreamJob
    redis_url: str | None  # None: the job runs over `ports` (memory ones)
    log_dir: Path
    launcher: Launcher = field(default_factory=ProcessLauncher)  # ThreadLauncher: a job in this process's threads
    plan: JobPlan | None = None
    notes: list[str] = field(default_factory=list)  # what a person starting the run should know (said once)
    # Called at every wait of a rescale or reconfiguration, which the run's loop waits on: the live view draws.
    while_waiting: Callable[[], None] = lambda: None
    # Sees the rescale's saved state at each wait of its controller: the chaos command's fault injector.
    rescale_fault: Callable[[RescaleState], None] | None = None
    # What the job runs over: the Redis at `redis_url` unless given (Ports.in_memory, with a ThreadLauncher
    # over the same ports: a whole job in this process, no Redis).
    ports: Ports | None = None

    def __post_init__(self) -> None:
        if self.job.metadata.namespace is not None:  # one default namespace here: keys by the job's name alone
            self.job = self.job.model_copy(update={"metadata": self.job.metadata.model_copy(update={"namespace": None})})
        if self.ports is None:
            self.ports = Ports.over_redis(connect(self.redis_url), self.job.metadata.name)
        self.r = self.ports.redis
        self.jobs = self.ports.jobs
        self.keys = JobKeys(self.job.metadata.name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes = Supervisor(self.jobs, lambda: self.job, self.redis_url, self.log_dir, self.launcher)
        self.fleet = ProcessFleet(self.processes, lambda: self.plan)

    @property
    def parallelism(self) -> dict[str, int]:
        """Each chain's instances, by its head's name."""
        return self.fleet.parallelism

    # --- start -----------------------------------------------------------------

    def start(self, prepare=None, fresh: bool = True,
              savepoint: Savepoint | None = None, reset: tuple[str, ...] = ()) -> bool:
        """Deploy and start the job; `prepare(r, plan)` runs before any worker (benchmarks seed state). Unless
        `fresh`, a run of the job found in Redis goes on from its last commits instead (see `_resume`); with
        a `savepoint`, from the savepoint's, which replaces what Redis holds of the job. Returns whether it
        resumed. A spec that names a savepoint (`restoreFrom`) starts from it where no run goes on. Going on
        under a changed spec, the stateful stages in `reset` start their state afresh."""
        if savepoint is None and not fresh and self.jobs.plan() is not None:
            self._resume(reset)
            return True
        if savepoint is None and self.job.spec.restore_from:
            savepoint = read_restore_from(self.job)
        if savepoint is not None:
            self._restore(savepoint, fresh, reset)
            self._resume(reset)
            return True
        self.jobs.clear(keep_input=True)  # producers may have written the input before this run started
        self.plan = JobPlan(self.job, int(time.time() * 1000))
        self.jobs.deploy(self.plan)
        # One set of workers per chain (chaining.py), named by its head.
        self.fleet.parallelism = {op: self.job.spec.operator(op).parallelism for op in self.plan.vertices}
        if prepare is not None:
            prepare(self.r, self.plan)
        self.fleet.start_all(before_sources=self._restamp, with_spares=True)
        return False

    def _restore(self, savepoint: Savepoint, replace: bool, reset: tuple[str, ...]) -> None:
        """Put the savepoint's keys in place of the job's; not under workers that may still run (they would
        commit over it) unless told to `replace` them (their registrations outlive a run that was killed)."""
        check(savepoint, self.job, reset)  # before anything of the job in this Redis is replaced
        if self.jobs.registered() and not replace:
            raise PreviousRun(f"workers of job '{self.job.metadata.name}' are registered in "
                              f"{redacted(self.redis_url)}: a run may be going on. Stop it (`streamjobs stop`), or "
                              "pass --fresh to replace it")
        restore(self.jobs, savepoint, max_parallelism=self.job.spec.max_parallelism)

    def _resume(self, reset: tuple[str, ...] = ()) -> None:
        """Go on with the run of this job that Redis holds: its plan, parallelism, state, offsets and event-time
        origin as its last commits left them (a run that died: the `streamjobs run` process, the machine). A
        spec that differs is then applied as a reconfiguration; one it cannot take is refused before anything
        starts. A run that was stopped has drained (every window fired, the end-of-stream watermark sent): it
        ended, and cannot go on."""
        running = self.jobs.plan()
        name = running.name
        if self.jobs.deployed_by() is not None:
            raise PreviousRun(f"job '{name}' in {redacted(self.redis_url)} belongs to a StreamJob resource (the "
                              "operator runs it); use another Redis, or --fresh to delete it and start anew")
        if self.jobs.stop_requested():
            raise PreviousRun(f"job '{name}' in {redacted(self.redis_url)} was stopped and drained: it ended. --fresh "
                              "starts it anew from nothing (its state, offsets and outputs are deleted)")
        changes = diff(running.job, self.job, reset)
        if changes.refused:
            raise Refused(changes.refused)
        self.jobs.resumed()
        wanted, self.job, self.plan = self.job, running.job, running
        self.jobs.forget_processes(running.vertices)
        self.fleet.parallelism = {op: (self.jobs.assignment(op) or running.initial_assignment(op)).parallelism
                                  for op in running.vertices}
        rescaled = {change.operator for change in changes.rescales}
        for op, n in self.parallelism.items():
            said = wanted.spec.operator(op).parallelism if op in {o.name for o in wanted.spec.operators} else n
            if said != n and op not in rescaled:  # rescaled while it ran: its assignment says more than the spec
                self.notes.append(f"{op} goes on with parallelism {n}, as it last ran; its spec says {said}: "
                                  f"`streamjobs rescale --job {self.job.metadata.name} --operator {op} --parallelism "
                                  f"{said} --redis-url URL` changes that")
        self.fleet.start_all(with_spares=True)  # event time goes on from the first run's origin
        self.resume_reconfigure()
        if changes.changes:
            self.reconfigure(wanted, reset=reset)

    def _restamp(self) -> None:
        self.plan = self.jobs.restamp(int(time.time() * 1000))

    # --- run -------------------------------------------------------------------

    def supervise(self) -> list[str]:
        """Restart workers that died (supervisor.py); what happened."""
        return self.processes.supervise()

    def kill(self, op: str, index: int, sig: int = signal.SIGKILL) -> None:
        self.processes.kill(op, index, sig)

    def request_stop(self) -> None:
        """Sources stop at their next offset and send the end-of-stream watermark."""
        self.jobs.request_stop()

    def drained(self) -> bool:
        for sink in self.job.spec.sinks:
            done = self.ports.exchange.members(self.keys.done(sink.name))
            if len(done) < self.parallelism[self.plan.head(sink.name)]:
                return False
        return True

    def wait_drained(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.drained():
                return True
            self.supervise()
            time.sleep(0.2)
        return False

    def restarts(self) -> int:
        return self.processes.total_restarts

    # --- rescale (rescale.py), its Fleet the processes (process_fleet.py) ---------

    def rescale(self, op: str, parallelism: int, strategy: Strategy | str | None = None,
                owners: tuple[int, ...] | None = None) -> RescaleRecord:
        """Change an operator's parallelism (or with `owners`, who owns which key group) while the job runs;
        return what it cost (see rescale.py)."""
        record = self.controller().rescale(op, parallelism, strategy, owners)
        self.parallelism[record.operator] = parallelism  # the chain's head, when `op` is chained
        return record

    def resume_rescale(self) -> RescaleRecord | None:
        """Finish (or roll back) a rescale whose controller died mid-way, as a restarted operator does."""
        record = self.controller().resume()
        if record is not None:
            self.parallelism[record.operator] = record.parallelism
        return record

    def controller(self) -> RescaleController:
        # Waiting inside a rescale still supervises: an old owner or a standby that dies is restarted.
        return RescaleController(self.jobs, self.plan, self.fleet, standby_timeout_s=self.fleet.ready_timeout_s,
                                 sleep=self._wait, on_wait=self.rescale_fault)

    def handle_requests(self) -> list[RescaleRecord | ReconfigureRecord | ControlRecord]:
        """Carry out rescales, reconfigurations and control events asked for by `streamjobs rescale`,
        `streamjobs reconfigure` and `streamjobs control` (through the job store)."""
        done: list[RescaleRecord | ReconfigureRecord | ControlRecord] = []
        while (request := self.jobs.next_rescale_request()) is not None:
            done.append(self.rescale(request.operator, request.parallelism, request.strategy, request.owners))
        while (asked := self.jobs.next_reconfigure_request()) is not None:
            job = StreamJob.model_validate_json(asked.job)
            try:
                record = self.reconfigure(job, asked.id, reset=asked.reset)
            except Refused as exc:
                record = ReconfigureRecord(None, tuple(c.describe() for c in exc.changes), asked.id,
                                           refused=str(exc))
            if record.version is None:  # nothing live: the asker still hears the outcome
                self.jobs.end_reconfigure(record)
            done.append(record)
        while (event := self.jobs.next_control_request()) is not None:
            done.append(self.control(event))
        return done

    # --- live reconfiguration (reconfigure.py) -------------------------------------

    def reconfigure(self, job: StreamJob, request: str | None = None, restart: bool = False,
                    reset: tuple[str, ...] = ()) -> ReconfigureRecord:
        """Change the running job to `job`: live changes at a consistent cut, then parallelism changes as
        rescales; a change that cannot be made raises Refused and nothing is applied. The record of the live
        part (its version None when only parallelism changed). `restart`: stop every worker and start them on
        the new plan instead (the stop-and-restart baseline). The stateful stages in `reset` start their state
        afresh at the cut."""
        changes, record = self._reconfigurer().apply(job, request, self.fleet if restart else None, reset)
        self.plan = self.jobs.plan()
        self.job = self.plan.job
        for change in changes.rescales:
            wanted = job.spec.operator(change.operator).parallelism
            if self.parallelism.get(self.plan.head(change.operator)) != wanted:
                self.rescale(change.operator, wanted)
        return record or ReconfigureRecord(None, tuple(c.describe() for c in changes.changes), request)

    def resume_reconfigure(self) -> ReconfigureRecord | None:
        """Wait out a reconfiguration a dead controller left (its version is published, its barriers flow)."""
        record = self._reconfigurer().resume()
        if record is not None:
            self.plan = self.jobs.plan()
            self.job = self.plan.job
        return record

    def control(self, event: ControlEvent) -> ControlRecord:
        """Deliver a control event to every instance of its operator at one sync point; their replies."""
        record = self._reconfigurer().deliver(event)
        if record.version is not None:
            self.plan = self.jobs.plan()
        return record

    def _reconfigurer(self) -> ReconfigureController:
        return ReconfigureController(self.jobs, self.fleet.ready_timeout_s, sleep=self._wait, fleet=self.fleet)

    def _wait(self, seconds: float) -> None:
        """A controller's wait: workers that die meanwhile are restarted, and the run's view keeps drawing."""
        self.supervise()
        self.while_waiting()
        time.sleep(seconds)

    # --- stop ------------------------------------------------------------------

    def shutdown(self, timeout_s: float = 15.0) -> None:
        self.processes.shutdown(timeout_s)
