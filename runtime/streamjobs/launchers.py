"""How the local runtime starts a worker: as an OS process (what users run), or as a thread of this process.

The runtime supervises, rescales and kills what a launcher starts through the same handle, Popen's: `poll`,
`wait`, `terminate`, `kill`, `send_signal`, `pid`. A thread worker (`ThreadLauncher`) runs the worker's
whole life (`streamjobs_worker.__main__.serve`) with a SparkSession of its own on this process's one JVM:
a job's workers start in a fraction of a second instead of a JVM each, which is what the tests whose subject
is the semantics of a job (handovers, cuts, recovery) need. Killing one abandons it as SIGKILL abandons a
process: its Redis connections are cut at once, so it commits nothing more (a transaction it had not sent
is never sent), and a new incarnation takes over from its last commit as after a real kill. Thread workers
may also run over one set of memory ports (`Ports.in_memory`: no Redis at all), each through its own
severable view of them, which a kill cuts the same way.
"""

from __future__ import annotations

import itertools
import os
import resource
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Protocol

import redis
from streamjobs_core.connect import apart
from streamjobs_worker.parent import parent_env
from streamjobs_worker.ports import Ports

# A waiting spare warms up on the CPU the job leaves idle, not on its workers' share.
SPARE_NICENESS = 19


class Launcher(Protocol):
    def start(self, log: Path, argv: list[str], redis_url: str, spare: bool) -> subprocess.Popen:
        """A worker with these arguments (`python -m streamjobs_worker` ones), logging to `log`; `spare`: it waits
        idle, on what the job leaves of the CPU."""

    def full_priority(self, worker) -> None:
        """A spare about to serve: back to the job's share of the CPU."""

    def kill_group(self, worker) -> None:
        """A worker that did not stop when asked: it and everything it started (its JVM), at once."""


def _redis_env(redis_url: str) -> dict[str, str]:
    url, credentials = apart(redis_url)
    return {"STREAMJOBS_REDIS_URL": url, **credentials.env()}


class ProcessLauncher:
    def start(self, log: Path, argv: list[str], redis_url: str, spare: bool) -> subprocess.Popen:
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "streamjobs_worker", *argv],
                # In the environment, not the command line: a password stays out of `ps`, and out of the URL
                # (connect.py). No worker outlives the runtime, even when the runtime itself is killed (parent.py).
                env={**os.environ, **_redis_env(redis_url), **parent_env()},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        if spare and _can_raise_priority():
            # Its own process group (a new session): its JVM, started later, inherits the niceness.
            os.setpriority(os.PRIO_PGRP, process.pid, SPARE_NICENESS)
        return process

    def full_priority(self, worker) -> None:
        if _can_raise_priority():
            os.setpriority(os.PRIO_PGRP, worker.pid, 0)  # the group: the spare, its JVM and their threads

    def kill_group(self, worker) -> None:
        os.killpg(worker.pid, signal.SIGKILL)


def _can_raise_priority() -> bool:
    """Whether a process this runtime lowers in priority can be raised back (root, or RLIMIT_NICE allows it)."""
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


class ThreadLauncher:
    def __init__(self, ports: Ports | None = None) -> None:
        self.ports = ports  # what every worker runs over (memory ones); None: each its own Redis client

    def start(self, log: Path, argv: list[str], redis_url: str | None, spare: bool) -> ThreadWorker:
        return ThreadWorker(log, ["--redis-url", redis_url or "", *argv], self.ports)

    def full_priority(self, worker) -> None:
        """Threads share the process's priority."""

    def kill_group(self, worker) -> None:
        worker.kill()


class ThreadWorker:
    """A worker's life in a thread, handled as a process: see the module's docstring."""

    _pids = itertools.count(2**30)  # not a process ID: distinct from any live process's

    def __init__(self, log: Path, argv: list[str], ports: Ports | None = None) -> None:
        from streamjobs_worker.__main__ import Signals, arguments

        self.pid = next(self._pids)
        self.returncode: int | None = None
        self._log = log
        self._args = arguments(argv)
        self._signals = Signals()
        self._severed = threading.Event()
        if ports is None:
            self._client = _severable_client(self._args.redis_url, self._severed)
            self._ports = Ports.over_redis(self._client, self._args.job)
        else:
            self._client, self._ports = None, ports.severable(self._severed)
        self._thread = threading.Thread(target=self._life, name=f"worker {log.stem}", daemon=True)
        self._thread.start()

    def _life(self) -> None:
        from streamjobs_worker import spark
        from streamjobs_worker.__main__ import serve

        spark.own_session()
        try:
            code = serve(self._args, self._signals, self._ports)
        except BaseException:  # noqa: BLE001 - a process would die of it: its log says why, its status 1
            with open(self._log, "a") as out:
                out.write(traceback.format_exc())
            code = 1
        if self.returncode is None:
            self.returncode = code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise subprocess.TimeoutExpired("worker thread", timeout or 0)
        return self.returncode

    def terminate(self) -> None:
        self._signals.terminate()

    def send_signal(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self.kill()
        elif sig == signal.SIGUSR1:
            self._signals.demote()
        else:
            self._signals.terminate()

    def kill(self) -> None:
        """Abandon it: its connections cut (whatever it sends next fails), its status -SIGKILL at once."""
        if self.returncode is not None:
            return
        self.returncode = -signal.SIGKILL
        self._severed.set()
        if self._client is not None:
            self._client.connection_pool.disconnect(inuse_connections=True)  # a blocked read ends too
        self._signals.terminate()


def _severable_client(url: str, severed: threading.Event) -> redis.Redis:
    """A client whose every command fails once `severed` is set, as a killed process's would never arrive: a
    MULTI/EXEC goes out in one write, so it either went before or never goes."""
    if not url.startswith("redis://"):
        raise ValueError("in-process workers use plain redis:// URLs")

    class Severable(redis.Connection):
        def send_packed_command(self, command, check_health: bool = True) -> None:
            if severed.is_set():
                raise redis.ConnectionError("this worker was killed")
            super().send_packed_command(command, check_health)

    return redis.Redis.from_url(url, connection_class=Severable)

