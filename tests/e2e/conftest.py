from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest
from rich.console import Console
from streamjobs_core.loading import load_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job_file():
    return lambda name: ROOT / name


@pytest.fixture
def run(redis_server, tmp_path):
    """Run a job on the session's redis-server, a process per worker, and return the report."""
    from streamjobs.run import run_job

    def _run(path: str, duration_s: float, **kwargs) -> dict:
        return run_job(load_job(ROOT / path), duration_s, redis_url=redis_server.url, console=Console(force_terminal=False),
                       log_dir=str(tmp_path / "logs"), **kwargs)

    return _run


@pytest.fixture
def run_in_process(run):
    """As `run`, every worker a thread of this process (one JVM): for tests whose subject is what a job computes
    and how it stays exact, not its processes. A SIGKILL abandons a thread as it would a process. `memory`:
    the job runs over memory ports (its store and exchange in this process) instead of the redis-server."""
    from streamjobs.launchers import ThreadLauncher
    from streamjobs_worker.ports import Ports

    def _run(path: str, duration_s: float | None, memory: bool = False, **kwargs) -> dict:
        ports = Ports.in_memory(load_job(ROOT / path).metadata.name) if memory else None
        return run(path, duration_s, launcher=ThreadLauncher(ports), ports=ports, **kwargs)

    return _run


def assert_exact(report: dict) -> None:
    verification = report["verification"]
    assert verification["lost"] == 0, verification
    assert verification["duplicated"] == 0, verification
    assert verification["correct"] is True, verification
    assert report["drained"]


def grown(r, key: str, by: int, timeout_s: float = 60.0) -> None:
    """Wait until the stream `key` holds `by` more entries than now: records flowed, however fast the machine."""
    import time

    target = r.xlen(key) + by
    deadline = time.monotonic() + timeout_s
    while r.xlen(key) < target:
        assert time.monotonic() < deadline, f"{key} did not grow by {by} in {timeout_s:.0f} s"
        time.sleep(0.1)


def killer(schedule: list[tuple[float, str, int]]):
    pending = sorted(schedule)
    killed: list[str] = []

    def during(runtime, elapsed: float) -> None:
        while pending and pending[0][0] <= elapsed:
            _, op, index = pending.pop(0)
            runtime.kill(op, index, signal.SIGKILL)
            killed.append(f"{op}/{index}")

    during.killed = killed
    return during


def in_a_thread(watch):
    """`watch(runtime)` started once, in a thread: a rescale blocks the runtime's loop that calls `during`."""
    started: list[threading.Thread] = []

    def start(runtime) -> None:
        if not started:
            started.append(threading.Thread(target=watch, args=(runtime,), daemon=True))
            started[0].start()

    return start
