"""The local runtime: one OS process per operator instance, supervised.

Start order matters for latency, not for correctness: stages and sinks start
first (each pays ~7 s for its SparkSession), then the event-time origin t0 is
fixed and the sources start, so the job does not begin with a backlog of the
warm-up time. A worker that dies is restarted; it resumes from its last commit.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from streamjobs_core.connect import connect
from streamjobs_core.keygroups import Assignment, moves
from streamjobs_core.plan import JobPlan, read_assignment, write_assignment
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
    parallelism: dict[str, int] = field(default_factory=dict)
    plan: JobPlan | None = None

    def __post_init__(self) -> None:
        self.r = connect(self.redis_url)
        self.keys = JobPlan(self.job, 0).keys
        self.log_dir.mkdir(parents=True, exist_ok=True)

    # --- start -----------------------------------------------------------------

    def start(self, ready_timeout_s: float = 120.0) -> None:
        self._clear_job_keys()
        spec = self.job.spec
        self.parallelism = {op.name: op.parallelism for op in spec.operators}
        self._write_plan(int(time.time() * 1000))
        for op in spec.operators:
            write_assignment(self.r, self.keys, op.name, self.plan.initial_assignment(op.name))
        self._start_all(ready_timeout_s, before_sources=lambda: self._write_plan(int(time.time() * 1000)))

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
        previous = self.instances.get((op, index))
        process = self._popen(op, index)
        self.instances[(op, index)] = _Instance(op, index, process, previous.restarts + 1 if previous else 0)

    def _popen(self, op: str, index: int, *extra: str) -> subprocess.Popen:
        with open(self.log_dir / f"{op}-{index}.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "streamjobs_worker", "--redis-url", self.redis_url, "--job",
                 self.job.metadata.name, "--operator", op, "--instance", str(index), *extra],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
            )

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
            if self.r.scard(self.keys.done(sink.name)) < self.parallelism[sink.name]:
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

    # --- rescale ---------------------------------------------------------------

    def rescale(self, op: str, parallelism: int, strategy: str, ready_timeout_s: float = 120.0) -> dict:
        """Change an operator's parallelism; return what it cost.

        `restart` is Flink's baseline: every worker of the job stops after its
        last commit (a consistent cut: every batch is committed or not at all),
        the new assignment is written and the whole job starts again.
        `all_at_once` keeps the rest of the job running: the new instances start
        as standbys (their SparkSession warm), then the old instances stop after
        their last commit and the new assignment hands every key group over at
        once; the operator pauses only for that switch and the state restore.
        """
        old = read_assignment(self.r, self.keys, op)
        make = Assignment.consistent_hashing if self.job.spec.rescale.assignment == "consistent_hashing" else Assignment.ranges
        new = make(parallelism, self.plan.key_groups(op), epoch=old.epoch + 1)
        started = time.monotonic()
        if strategy == "restart":
            self._stop([k for k in self.instances])
            paused = time.monotonic()
            write_assignment(self.r, self.keys, op, new)
            self.parallelism[op] = parallelism
            self._start_all(ready_timeout_s)
        elif strategy == "all_at_once":
            self.r.delete(self.keys.standby(op))
            standbys = {i: self._popen(op, i, "--await-epoch", str(new.epoch)) for i in range(parallelism)}
            self._wait_standby(op, parallelism, ready_timeout_s)
            self._stop([k for k in self.instances if k[0] == op])
            paused = time.monotonic()
            write_assignment(self.r, self.keys, op, new)
            self.parallelism[op] = parallelism
            for i, process in standbys.items():
                self.instances[(op, i)] = _Instance(op, i, process)
            self.wait_ready([(op, i) for i in range(parallelism)], ready_timeout_s)
        else:
            raise ValueError(f"unknown rescale strategy '{strategy}'")
        done = time.monotonic()
        record = {
            "operator": op, "from": old.parallelism, "to": parallelism, "strategy": strategy, "epoch": new.epoch,
            "moved_key_groups": len(moves(old, new)), "rescale_s": round(done - started, 3),
            "pause_ms": round((done - paused) * 1000, 1),
        }
        self.r.rpush(self.keys.rescale_history, json.dumps(record))
        return record

    def _wait_standby(self, op: str, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.r.hlen(self.keys.standby(op)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"standby instances of '{op}' not ready; see logs in {self.log_dir}")
            time.sleep(0.1)

    def _start_all(self, ready_timeout_s: float, before_sources=lambda: None) -> None:
        sources = {s.name for s in self.job.spec.sources}
        first = [(op, i) for op, n in self.parallelism.items() if op not in sources for i in range(n)]
        then = [(op, i) for op, n in self.parallelism.items() if op in sources for i in range(n)]
        for group in (first, then):
            if group is then:
                before_sources()
            for op, i in group:
                self._spawn(op, i)
            self.wait_ready(group, ready_timeout_s)

    def handle_requests(self) -> list[dict]:
        """Carry out rescales asked for by `streamjobs rescale` (through Redis)."""
        done = []
        while (raw := self.r.lpop(self.keys.rescale_requests)) is not None:
            request = json.loads(raw)
            done.append(self.rescale(request["operator"], request["parallelism"], request["strategy"]))
        return done

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
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            self.r.hdel(self.keys.metrics_endpoints, f"{key[0]}/{key[1]}")

    def shutdown(self, timeout_s: float = 15.0) -> None:
        self._stop(list(self.instances), timeout_s)
