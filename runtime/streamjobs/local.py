"""The local runtime: one OS process per operator instance, supervised.

Start order matters for latency, not for correctness: stages and sinks start
first (each pays ~7 s for its SparkSession), then the event-time origin t0 is
fixed and the sources start, so the job does not begin with a backlog of the
warm-up time. A worker that dies is restarted; it resumes from its last commit.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from streamjobs_core.connect import connect
from streamjobs_core.plan import JobPlan, write_assignment
from streamjobs_core.spec import StreamJob

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # No worker outlives the runtime, even when the runtime itself is killed.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Instance:
    op: str
    index: int
    process: subprocess.Popen
    restarts: int = 0


@dataclass
class LocalRuntime:
    job: StreamJob
    redis_url: str
    log_dir: Path
    restart_workers: bool = True
    instances: dict[tuple[str, int], _Instance] = field(default_factory=dict)
    plan: JobPlan | None = None

    def __post_init__(self) -> None:
        self.r = connect(self.redis_url)
        self.keys = JobPlan(self.job, 0).keys
        self.log_dir.mkdir(parents=True, exist_ok=True)

    # --- start -----------------------------------------------------------------

    def start(self, ready_timeout_s: float = 120.0) -> None:
        self._clear_job_keys()
        spec = self.job.spec
        self._write_plan(int(time.time() * 1000))
        for op in spec.operators:
            write_assignment(self.r, self.keys, op.name, self.plan.initial_assignment(op.name))
        source_names = {s.name for s in spec.sources}
        for op in spec.operators:
            if op.name not in source_names:
                for i in range(op.parallelism):
                    self._spawn(op.name, i)
        self.wait_ready([k for k in self.instances], ready_timeout_s)
        self._write_plan(int(time.time() * 1000))
        for source in spec.sources:
            for i in range(source.parallelism):
                self._spawn(source.name, i)
        self.wait_ready([(s.name, i) for s in spec.sources for i in range(s.parallelism)], ready_timeout_s)

    def _write_plan(self, t0_ms: int) -> None:
        self.plan = JobPlan(self.job, t0_ms)
        self.r.set(self.keys.plan, self.plan.to_json())

    def _clear_job_keys(self) -> None:
        batch = []
        for key in self.r.scan_iter(match=self.keys.pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                self.r.delete(*batch)
                batch = []
        if batch:
            self.r.delete(*batch)

    def _spawn(self, op: str, index: int) -> None:
        log = open(self.log_dir / f"{op}-{index}.log", "ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "streamjobs_worker", "--redis-url", self.redis_url, "--job", self.job.metadata.name,
             "--operator", op, "--instance", str(index)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
        )
        log.close()
        previous = self.instances.get((op, index))
        self.instances[(op, index)] = _Instance(op, index, process, previous.restarts + 1 if previous else 0)

    def wait_ready(self, instances: list[tuple[str, int]], timeout_s: float) -> None:
        """Wait until each instance registered its metrics endpoint (it does so once it can process)."""
        deadline = time.monotonic() + timeout_s
        wanted = {f"{op}/{i}" for op, i in instances}
        while True:
            registered = {k.decode() for k in self.r.hkeys(self.keys.metrics_endpoints)}
            if wanted <= registered:
                return
            self.supervise()
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not ready: {sorted(wanted - registered)}; see logs in {self.log_dir}")
            time.sleep(0.2)

    # --- run -------------------------------------------------------------------

    def supervise(self) -> list[str]:
        """Restart workers that died; return what was restarted."""
        restarted = []
        for (op, index), inst in list(self.instances.items()):
            code = inst.process.poll()
            if code is not None and self.restart_workers:
                self.r.hdel(self.keys.metrics_endpoints, f"{op}/{index}")
                self._spawn(op, index)
                restarted.append(f"{op}/{index} (exit {code})")
        return restarted

    def kill(self, op: str, index: int, sig: int = signal.SIGKILL) -> None:
        self.instances[(op, index)].process.send_signal(sig)

    def request_stop(self) -> None:
        """Sources stop at their next offset and send the end-of-stream watermark."""
        self.r.hset(self.keys.control, "stop", "1")

    def drained(self) -> bool:
        for sink in self.job.spec.sinks:
            if self.r.scard(self.keys.done(sink.name)) < sink.parallelism:
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
        return sum(inst.restarts for inst in self.instances.values())

    # --- stop ------------------------------------------------------------------

    def shutdown(self, timeout_s: float = 15.0) -> None:
        for inst in self.instances.values():
            if inst.process.poll() is None:
                inst.process.terminate()
        deadline = time.monotonic() + timeout_s
        for inst in self.instances.values():
            try:
                inst.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(inst.process.pid, signal.SIGKILL)
                inst.process.wait()
