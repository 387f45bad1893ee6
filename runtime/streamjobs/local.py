"""The local runtime: one OS process per instance of each chain of operators, supervised.

Start order matters for latency, not for correctness: stages and sinks start
first (each pays ~7 s for its SparkSession), then the event-time origin t0 is
fixed and the generator sources start, so the job does not begin with a
backlog of the warm-up time (sources of external input start with the rest:
their input waits in Redis anyway). A worker that dies is restarted; it
resumes from its last commit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from streamjobs_core.connect import connect, redacted
from streamjobs_core.control import (
    EXIT_FAILED,
    ControlEvent,
    ControlRecord,
    InstanceAddress,
    JobFailure,
    Promotion,
    ReconfigureRecord,
    RescaleRecord,
    RescaleState,
    Strategy,
)
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.plan import JobPlan
from streamjobs_core.reconfigure import ReconfigureController, Refused, diff
from streamjobs_core.rescale import RescaleController
from streamjobs_core.savepoint import Savepoint, check, read_restore_from, restore
from streamjobs_core.spec import StreamJob

from .launchers import Launcher, ProcessLauncher

_ERROR_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Column)): (.+)$")


def last_error(log: Path, tail_bytes: int = 65536) -> str | None:
    """The last exception a worker's log ends a traceback with, as `Name: message`: a worker that fails on
    its input (a key column missing, a bad query) says why where the run is watched, not only in its log."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        match = _ERROR_LINE.match(line.strip())
        if match:
            return f"{match.group(1)}: {match.group(2)}"
    return None


def _exit_said(code: int, error: str | None) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}{f': {error}' if error else ''}"


class PreviousRun(RuntimeError):
    """The job's earlier run in this Redis cannot go on; the message says why and what to do."""


class JobFailed(RuntimeError):
    """A worker said the job cannot go on, or one kept dying past `restarts.maxAttempts`."""

    def __init__(self, failure: JobFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


@dataclass
class _Instance:
    op: str
    index: int
    process: subprocess.Popen
    epoch: int | None = None  # a standby waiting for this epoch
    started: float = field(default_factory=time.monotonic)
    failures: int = 0  # deaths in a row, each before the instance committed anything or ran long
    restart_at: float | None = None  # dead, to be started again then (exponential backoff)


@dataclass
class _Spare:
    name: str
    process: subprocess.Popen


@dataclass
class LocalRuntime:
    job: StreamJob
    redis_url: str
    log_dir: Path
    launcher: Launcher = field(default_factory=ProcessLauncher)  # ThreadLauncher: a job in this process's threads
    restart_workers: bool = True
    ready_timeout_s: float = 180.0
    instances: dict[tuple[str, int], _Instance] = field(default_factory=dict)
    standbys: dict[tuple[str, int], _Instance] = field(default_factory=dict)
    spares: dict[str, list[_Spare]] = field(default_factory=dict)  # per chain, oldest (warmest) first
    promoted: int = 0  # spares that became an instance or a standby
    spare_serial: int = 0
    total_restarts: int = 0  # instances come and go with rescales; their restarts still count
    parallelism: dict[str, int] = field(default_factory=dict)
    plan: JobPlan | None = None
    notes: list[str] = field(default_factory=list)  # what a person starting the run should know (said once)
    # Called at every wait of a rescale or reconfiguration, which the run's loop waits on: the live view draws.
    while_waiting: Callable[[], None] = lambda: None
    # Sees the rescale's saved state at each wait of its controller: the chaos command's fault injector.
    rescale_fault: Callable[[RescaleState], None] | None = None

    def __post_init__(self) -> None:
        if self.job.metadata.namespace is not None:  # one default namespace here: keys by the job's name alone
            self.job = self.job.model_copy(update={"metadata": self.job.metadata.model_copy(update={"namespace": None})})
        self.r = connect(self.redis_url)
        self.jobs = RedisJobStore(self.r, self.job.metadata.name)
        self.keys = self.jobs.keys
        self.log_dir.mkdir(parents=True, exist_ok=True)

    # --- start -----------------------------------------------------------------

    def start(self, ready_timeout_s: float = 120.0, prepare=None, fresh: bool = True,
              savepoint: Savepoint | None = None, reset: tuple[str, ...] = ()) -> bool:
        """Deploy and start the job; `prepare(r, plan)` runs before any worker (benchmarks seed state). Unless
        `fresh`, a run of the job found in Redis goes on from its last commits instead (see `_resume`); with
        a `savepoint`, from the savepoint's, which replaces what Redis holds of the job. Returns whether it
        resumed. A spec that names a savepoint (`restoreFrom`) starts from it where no run goes on. Going on
        under a changed spec, the stateful stages in `reset` start their state afresh."""
        if savepoint is None and not fresh and self.jobs.plan() is not None:
            self._resume(ready_timeout_s, reset)
            return True
        if savepoint is None and self.job.spec.restore_from:
            savepoint = read_restore_from(self.job)
        if savepoint is not None:
            self._restore(savepoint, fresh, reset)
            self._resume(ready_timeout_s, reset)
            return True
        self.jobs.clear(keep_input=True)  # producers may have written the input before this run started
        self.plan = JobPlan(self.job, int(time.time() * 1000))
        self.jobs.deploy(self.plan)
        # One set of workers per chain (chaining.py), named by its head.
        self.parallelism = {op: self.job.spec.operator(op).parallelism for op in self.plan.vertices}
        if prepare is not None:
            prepare(self.r, self.plan)
        self._start_all(ready_timeout_s, before_sources=self._restamp, with_spares=True)
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

    def _resume(self, ready_timeout_s: float, reset: tuple[str, ...] = ()) -> None:
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
        self.parallelism = {op: (self.jobs.assignment(op) or running.initial_assignment(op)).parallelism
                            for op in running.vertices}
        rescaled = {change.operator for change in changes.rescales}
        for op, n in self.parallelism.items():
            said = wanted.spec.operator(op).parallelism if op in {o.name for o in wanted.spec.operators} else n
            if said != n and op not in rescaled:  # rescaled while it ran: its assignment says more than the spec
                self.notes.append(f"{op} goes on with parallelism {n}, as it last ran; its spec says {said}: "
                                  f"`streamjobs rescale --job {self.job.metadata.name} --operator {op} --parallelism "
                                  f"{said} --redis-url URL` changes that")
        self._start_all(ready_timeout_s, with_spares=True)  # event time goes on from the first run's origin
        self.resume_reconfigure()
        if changes.changes:
            self.reconfigure(wanted, reset=reset)

    def _restamp(self) -> None:
        self.plan = self.jobs.restamp(int(time.time() * 1000))

    def _spawn(self, op: str, index: int) -> None:
        self.instances[(op, index)] = _Instance(op, index, self._start_instance(op, index))

    def _start_instance(self, op: str, index: int, epoch: int | None = None) -> subprocess.Popen:
        """Instance `index` of `op` (or its standby for `epoch`): a spare promoted, or a new process when there
        is none."""
        standby = () if epoch is None else ("--await-epoch", str(epoch))
        return self._promote(op, Promotion(index, epoch)) or self._popen(
            f"{op}-{index}", op, "--instance", str(index), *standby)

    def _popen(self, log_name: str, op: str, *args: str, spare: bool = False) -> subprocess.Popen:
        return self.launcher.start(self.log_dir / f"{log_name}.log",
                                   ["--job", self.job.metadata.name, "--operator", op, *args], self.redis_url, spare)

    # --- warm spares (spares.py) -------------------------------------------------

    def _fill_spares(self) -> None:
        """Start `rescale.spareInstances` spares for each chain that runs Spark, with its first workers (nothing
        runs yet, so they warm up at full speed). While the job runs, only a scale-in refills the pool."""
        wanted = self.job.spec.rescale.spare_instances
        for op in self.plan.vertices:
            pool = self.spares.setdefault(op, [])
            while self.plan.runs_spark(op) and len(pool) < wanted:
                pool.append(self._new_spare(op, idle_cpu=False))

    def _new_spare(self, op: str, idle_cpu: bool) -> _Spare:
        name = self._spare_name()
        return _Spare(name, self._popen(f"{op}-spare-{name}", op, "--spare", name, spare=idle_cpu))

    def _spare_name(self) -> str:
        self.spare_serial += 1
        return f"s{self.spare_serial}"

    def _wait_spares(self, timeout_s: float) -> None:
        """Wait until every spare has Spark up and its chain rehearsed."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready = {op: self.jobs.ready_spares(op) for op in self.spares}
            waiting = [f"{op}/{spare.name}" for op, pool in self.spares.items()
                       for spare in pool if spare.name not in ready[op]]
            if not waiting:
                return
            self.supervise()
            if time.monotonic() > deadline:
                raise TimeoutError(f"spares not warm: {waiting}; see logs in {self.log_dir}")
            time.sleep(0.2)

    def _promote(self, op: str, promotion: Promotion) -> subprocess.Popen | None:
        """The oldest live spare of `op`, told what it becomes and back at full priority; None if none is left."""
        pool = self.spares.get(op, [])
        while pool:
            spare = pool.pop(0)
            if spare.process.poll() is not None:
                continue
            self.launcher.full_priority(spare.process)
            self.jobs.promote(op, spare.name, promotion)
            self.promoted += 1
            return spare.process
        return None

    def wait_ready(self, instances: list[tuple[str, int]], timeout_s: float) -> None:
        """Wait until each instance registered its metrics endpoint (it does so once it can process)."""
        deadline = time.monotonic() + timeout_s
        wanted = set(instances)
        while True:
            missing = wanted - set(self.jobs.registered())
            if not missing:
                return
            self.supervise()
            if time.monotonic() > deadline:
                op, i = sorted(missing)[0]
                names = sorted(InstanceAddress(o, n, "").field for o, n in missing)
                raise JobFailed(JobFailure(op, i, f"not ready after {timeout_s:.0f} s ({', '.join(names)}); see "
                                           f"{self.log_dir / f'{op}-{i}.log'}"))
            time.sleep(0.2)

    # --- run -------------------------------------------------------------------

    def supervise(self) -> list[str]:
        """Restart workers that died, each after a delay that grows while it keeps dying (Flink's
        exponential-delay strategy); return what happened. JobFailed when a worker says the job cannot go on,
        or one died more than `restarts.maxAttempts` times in a row."""
        restarted = []
        now = time.monotonic()
        for (op, index), inst in list(self.instances.items()):
            code = inst.process.poll()
            if code is None or not self.restart_workers:
                continue
            if inst.restart_at is None:
                restarted.append(self._died(inst, code, now))
            if now >= inst.restart_at:
                self.instances[(op, index)] = _Instance(op, index, self._start_instance(op, index),
                                                        failures=inst.failures)
                self.total_restarts += 1
        for (op, index), inst in list(self.standbys.items()):
            code = inst.process.poll()
            if code is not None and self.restart_workers:
                process = self._start_instance(op, index, inst.epoch)
                self.standbys[(op, index)] = _Instance(op, index, process, inst.epoch)
                self.total_restarts += 1
                restarted.append(f"standby {op}/{index} (exit {code})")
        for op, pool in self.spares.items():
            for i, spare in enumerate(pool):
                if spare.process.poll() is not None and self.restart_workers:
                    # It held nothing: not a worker restart. Started on the CPU the job leaves idle.
                    pool[i] = self._new_spare(op, idle_cpu=True)
        return restarted

    def _died(self, inst: _Instance, code: int, now: float) -> str:
        """Decide when a dead instance starts again; what to say of it."""
        op, index = inst.op, inst.index
        self.jobs.unregister(op, index)
        failure = self.jobs.failure()
        error = last_error(self.log_dir / f"{op}-{index}.log") if code > 0 else None
        if code == EXIT_FAILED or failure is not None:
            raise JobFailed(failure or JobFailure(op, index, error or f"exit {code}"))
        settings = self.job.spec.restarts
        said = _exit_said(code, error)
        attempt = self.jobs.attempt(op, index)
        own = attempt is not None and attempt.pid == inst.process.pid
        if own and not attempt.cause:  # what the worker could not say of its death, for its next start
            self.jobs.save_attempt(op, index, replace(attempt, cause=said))
        progressed = own and attempt.committed
        if progressed or (now - inst.started) * 1000 >= settings.reset_backoff_threshold_ms:
            inst.failures = 0
        inst.failures += 1
        if inst.failures > settings.max_attempts:
            raise JobFailed(JobFailure(op, index, f"died {inst.failures} times in a row ({said})",
                                       attempt.where if attempt is not None else ""))
        delay = min(settings.max_backoff_ms, settings.initial_backoff_ms
                    * settings.backoff_multiplier ** (inst.failures - 1)) / 1000
        inst.restart_at = now + delay
        again = f", {inst.failures} in a row" if inst.failures > 1 else ""
        return f"{op}/{index} ({said}); starts again in {delay:.1f} s{again}"

    def kill(self, op: str, index: int, sig: int = signal.SIGKILL) -> None:
        self.instances[(op, index)].process.send_signal(sig)

    def request_stop(self) -> None:
        """Sources stop at their next offset and send the end-of-stream watermark."""
        self.jobs.request_stop()

    def drained(self) -> bool:
        for sink in self.job.spec.sinks:
            if self.r.scard(self.keys.done(sink.name)) < self.parallelism[self.plan.head(sink.name)]:
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
        return self.total_restarts

    # --- rescale: the Fleet of the rescale controller, as processes -----------

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
        return RescaleController(self.jobs, self.plan, self, standby_timeout_s=self.ready_timeout_s,
                                 sleep=self._wait,
                                 on_wait=self.rescale_fault)

    def start_standbys(self, op: str, parallelism: int, epoch: int) -> None:
        for i in range(parallelism):
            if (op, i) not in self.standbys:
                self.standbys[(op, i)] = _Instance(op, i, self._start_instance(op, i, epoch), epoch)

    def stop_old(self, op: str, epoch: int) -> None:
        self._stop([k for k in self.instances if k[0] == op])

    def adopt(self, op: str, parallelism: int, epoch: int) -> None:
        for key in [k for k in self.standbys if k[0] == op]:
            self.instances[key] = self.standbys.pop(key)
        self.parallelism[op] = parallelism
        self.wait_ready([(op, i) for i in range(parallelism)], self.ready_timeout_s)

    def discard_standbys(self, op: str, epoch: int) -> None:
        self._kill_standbys([k for k in self.standbys if k[0] == op])  # only one rescale runs at a time

    def _kill_standbys(self, which: list[tuple[str, int]]) -> None:
        for key in which:
            process = self.standbys.pop(key).process
            process.kill()
            process.wait()

    def add_instances(self, op: str, parallelism: int) -> None:
        for i in range(parallelism):
            if (op, i) not in self.instances:
                self._spawn(op, i)
        self.wait_ready([(op, i) for i in range(parallelism)], self.ready_timeout_s)

    def remove_instances(self, op: str, parallelism: int) -> None:
        removed = sorted(k for k in self.instances if k[0] == op and k[1] >= parallelism)
        room = self.job.spec.rescale.spare_instances - len(self.spares.get(op, ())) if self.plan.runs_spark(op) else 0
        for key in removed[:max(0, room)]:
            self._demote(*key)
        self._stop(removed[max(0, room):])

    def start_chain(self, op: str, parallelism: int) -> None:
        self.parallelism[op] = parallelism
        self.add_instances(op, parallelism)

    def stop_chain(self, op: str) -> None:
        self._stop(sorted(k for k in self.instances if k[0] == op))
        self.parallelism.pop(op, None)
        for spare in self.spares.pop(op, []):
            spare.process.kill()
            spare.process.wait()

    def _demote(self, op: str, index: int) -> None:
        """Instance `index` becomes a spare after its current batch, keeping its warm JVM (spares.py)."""
        process = self.instances.pop((op, index)).process
        self.jobs.unregister(op, index)
        name = self._spare_name()
        self.jobs.demote(op, index, name)
        process.send_signal(signal.SIGUSR1)
        self.spares.setdefault(op, []).append(_Spare(name, process))

    def stop_job(self) -> None:
        self._stop(list(self.instances))

    def start_job(self, parallelism: dict[str, int]) -> None:
        self.parallelism.update(parallelism)
        self._start_all(self.ready_timeout_s)

    def _start_all(self, ready_timeout_s: float, before_sources=lambda: None, with_spares: bool = False) -> None:
        # Generators start last, from a fresh t0, so the job does not begin with the warm-up as backlog;
        # external input is waiting in Redis already: its sources start with the rest.
        sources = {s.name for s in self.job.spec.sources if s.type != "redis_stream"}
        first = [(op, i) for op, n in self.parallelism.items() if op not in sources for i in range(n)]
        then = [(op, i) for op, n in self.parallelism.items() if op in sources for i in range(n)]
        for group in (first, then):
            if group is then:
                before_sources()
            for op, i in group:
                self._spawn(op, i)
            if with_spares and group is first:  # nothing runs yet: spares warm at full speed, with the workers
                self._fill_spares()
            self.wait_ready(group, ready_timeout_s)
            if with_spares and group is first:
                self._wait_spares(ready_timeout_s)

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
        changes, record = self._reconfigurer().apply(job, request, self if restart else None, reset)
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
        return ReconfigureController(self.jobs, self.ready_timeout_s, sleep=self._wait, fleet=self)

    def _wait(self, seconds: float) -> None:
        """A controller's wait: workers that die meanwhile are restarted, and the run's view keeps drawing."""
        self.supervise()
        self.while_waiting()
        time.sleep(seconds)

    # --- stop ------------------------------------------------------------------

    def _stop(self, which: list[tuple[str, int]], timeout_s: float = 15.0) -> None:
        """Stop instances after their current batch (SIGTERM), forget them and their endpoints."""
        for key in which:
            if self.instances[key].process.poll() is None:
                self.instances[key].process.terminate()
        deadline = time.monotonic() + timeout_s
        for key in which:
            process = self.instances.pop(key).process
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.launcher.kill_group(process)
                process.wait()
            self.jobs.unregister(*key)

    def shutdown(self, timeout_s: float = 15.0) -> None:
        self._stop(list(self.instances), timeout_s)
        self._kill_standbys(list(self.standbys))
        for pool in self.spares.values():
            for spare in pool:
                spare.process.kill()
                spare.process.wait()
        self.spares.clear()
