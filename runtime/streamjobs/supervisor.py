"""The local runtime's worker processes: each instance and standby of each chain, started (from a warm spare
when there is one), restarted when it dies, after a delay that grows while it keeps dying (Flink's
exponential-delay strategy), and stopped after its current batch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from streamjobs_core.control import EXIT_FAILED, InstanceAddress, JobFailure, Promotion
from streamjobs_core.jobstore import JobStore
from streamjobs_core.spec import StreamJob

from .launchers import Launcher
from .spare_pool import SparePool

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


class JobFailed(RuntimeError):
    """A worker said the job cannot go on, or one kept dying past `restarts.maxAttempts`."""

    def __init__(self, failure: JobFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


@dataclass
class Instance:
    op: str
    index: int
    process: subprocess.Popen
    epoch: int | None = None  # a standby waiting for this epoch
    started: float = field(default_factory=time.monotonic)
    failures: int = 0  # deaths in a row, each before the instance committed anything or ran long
    restart_at: float | None = None  # dead, to be started again then (exponential backoff)


class Supervisor:
    def __init__(self, jobs: JobStore, job: Callable[[], StreamJob], redis_url: str, log_dir: Path,
                 launcher: Launcher) -> None:
        self.jobs = jobs
        self._job = job  # the job as it runs now: a reconfiguration may change its restart settings
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.launcher = launcher
        self.instances: dict[tuple[str, int], Instance] = {}
        self.standbys: dict[tuple[str, int], Instance] = {}
        self.spares = SparePool(jobs, launcher, self._popen)
        self.total_restarts = 0  # instances come and go with rescales; their restarts still count

    def spawn(self, op: str, index: int) -> None:
        self.instances[(op, index)] = Instance(op, index, self._start(op, index))

    def spawn_standby(self, op: str, index: int, epoch: int) -> None:
        self.standbys[(op, index)] = Instance(op, index, self._start(op, index, epoch), epoch)

    def _start(self, op: str, index: int, epoch: int | None = None) -> subprocess.Popen:
        """Instance `index` of `op` (or its standby for `epoch`): a spare promoted, or a new process when there
        is none."""
        standby = () if epoch is None else ("--await-epoch", str(epoch))
        return self.spares.promote(op, Promotion(index, epoch)) or self._popen(
            f"{op}-{index}", op, ("--instance", str(index), *standby), False)

    def _popen(self, log_name: str, op: str, args: tuple[str, ...], idle_cpu: bool) -> subprocess.Popen:
        return self.launcher.start(self.log_dir / f"{log_name}.log",
                                   ["--job", self._job().metadata.name, "--operator", op, *args], self.redis_url,
                                   idle_cpu)

    def wait_ready(self, instances: list[tuple[str, int]], timeout_s: float) -> None:
        """Wait until each instance registered its metrics endpoint (it does so once it can process)."""
        deadline = time.monotonic() + timeout_s
        wanted = set(instances)
        while missing := wanted - set(self.jobs.registered()):
            self.supervise()
            if time.monotonic() > deadline:
                op, i = sorted(missing)[0]
                names = sorted(InstanceAddress(o, n, "").field for o, n in missing)
                raise JobFailed(JobFailure(op, i, f"not ready after {timeout_s:.0f} s ({', '.join(names)}); see "
                                           f"{self.log_dir / f'{op}-{i}.log'}"))
            time.sleep(0.2)

    def wait_spares(self, timeout_s: float) -> None:
        """Wait until every spare has Spark up and its chain rehearsed."""
        deadline = time.monotonic() + timeout_s
        while waiting := self.spares.not_ready():
            self.supervise()
            if time.monotonic() > deadline:
                raise TimeoutError(f"spares not warm: {waiting}; see logs in {self.log_dir}")
            time.sleep(0.2)

    def supervise(self) -> list[str]:
        """Restart workers that died; return what happened. JobFailed when a worker says the job cannot go on,
        or one died more than `restarts.maxAttempts` times in a row."""
        restarted = []
        now = time.monotonic()
        for (op, index), inst in list(self.instances.items()):
            code = inst.process.poll()
            if code is None:
                continue
            if inst.restart_at is None:
                restarted.append(self._died(inst, code, now))
            if now >= inst.restart_at:
                self.instances[(op, index)] = Instance(op, index, self._start(op, index), failures=inst.failures)
                self.total_restarts += 1
        for (op, index), inst in list(self.standbys.items()):
            code = inst.process.poll()
            if code is not None:
                self.spawn_standby(op, index, inst.epoch)
                self.total_restarts += 1
                restarted.append(f"standby {op}/{index} (exit {code})")
        self.spares.replace_dead()
        return restarted

    def _died(self, inst: Instance, code: int, now: float) -> str:
        """Decide when a dead instance starts again; what to say of it."""
        op, index = inst.op, inst.index
        self.jobs.unregister(op, index)
        failure = self.jobs.failure()
        error = last_error(self.log_dir / f"{op}-{index}.log") if code > 0 else None
        if code == EXIT_FAILED or failure is not None:
            raise JobFailed(failure or JobFailure(op, index, error or f"exit {code}"))
        settings = self._job().spec.restarts
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

    def adopt_standbys(self, op: str) -> None:
        """`op`'s standbys become its instances (their epoch's assignment is written)."""
        for key in [k for k in self.standbys if k[0] == op]:
            self.instances[key] = self.standbys.pop(key)

    def demote(self, op: str, index: int) -> None:
        """Instance `index` of `op` becomes a spare after its current batch."""
        self.spares.demote(op, index, self.instances.pop((op, index)).process)

    def kill_standbys(self, which: list[tuple[str, int]]) -> None:
        for key in which:
            process = self.standbys.pop(key).process
            process.kill()
            process.wait()

    def stop(self, which: list[tuple[str, int]], timeout_s: float = 15.0) -> None:
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
        self.stop(list(self.instances), timeout_s)
        self.kill_standbys(list(self.standbys))
        self.spares.stop()
