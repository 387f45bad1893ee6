"""`streamjobs chaos`: a NEXMark job under a varying load with the ds2 autoscaler on, through random
SIGKILLs of workers (some while a rescale prestages or hands over), a rescale controller that dies
mid-handover and a redis-server SIGKILLed and restarted from its AOF; verified against the oracle.

Faults come from a thread beside the runtime's loop: a rescale blocks that loop for as long as it
takes, and kills during prestage and handover are the point. The controller's death is injected at
one of its wait points in HANDOVER (its state is then only what it saved in Redis, as after a process
death); the runtime's loop resumes the rescale with a fresh controller, as a restarted operator does.
"""

from __future__ import annotations

import random
import threading
import time

import redis
from rich.console import Console
from streamjobs_core.control import Phase, RescaleRequest, RescaleState
from streamjobs_core.loading import parse_job
from streamjobs_core.spec import StreamJob

from .redis_server import RedisServer
from .run import run_job

STAGE = "bids-per-auction"
BURST = 5
AOF_FSYNC = "always"  # every acknowledged commit is on disk before the reply: a SIGKILL loses none


class ControllerDied(RuntimeError):
    pass


def chaos_job(duration_s: float, records_per_s: int, marker_max_lag_records: int | None = None) -> StreamJob:
    rescale = {"strategy": "batched", "batchKeyGroups": 3}
    if marker_max_lag_records is not None:
        rescale["markerMaxLagRecords"] = marker_max_lag_records
    period = round(duration_s * 0.375)  # the load rises and falls more than once in a run
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "chaos"},
        "spec": {
            "maxParallelism": 12,
            "sources": [{"name": "events", "type": "nexmark", "seed": 7, "outOfOrderMs": 200,
                         "activeAuctions": 200, "parallelism": 2,
                         "rate": {"profile": "sine", "recordsPerSecond": records_per_s,
                                  "amplitude": records_per_s * 3 // 5, "periodS": period}}],
            # A simulated per-record cost (sleeping) gives the autoscaler something to scale on 2 cores.
            "stages": [{"name": STAGE, "type": "window_aggregate", "inputs": ["events"], "where": "event_type = 2",
                        "keyBy": "bid_auction", "simulatedCostUs": 1000,
                        "window": {"type": "tumbling", "sizeMs": 2000},
                        "aggregations": [{"function": "count", "as": "bids"}]}],
            "sinks": [{"name": "bids", "type": "redis_stream", "inputs": [STAGE]}],
            "state": {"snapshotEveryBatches": 5},
            "rescale": rescale,
            "autoscaler": {"policy": "ds2", "intervalS": 2, "metricsWindowS": 8, "stabilizationS": 10,
                           "catchUpSeconds": 30, "expectedRescaleS": 0, "scaleDownDelayS": 20,
                           "maxParallelism": 3},
        },
    })


class Chaos:
    """The faults, their times and how long the job took to be whole again after each."""

    def __init__(self, server: RedisServer, kills: int, duration_s: float, seed: int = 1) -> None:
        self.server = server
        self.rng = random.Random(seed)
        # A quarter of the kills wait for a rescale to prestage or hand over; the rest come in bursts
        # of up to BURST with quiet stretches between, in which the autoscaler can see a steady window
        # (any restart begins its window again).
        self.in_rescales = kills // 4
        self.spend_in_rescales_at = duration_s - 30  # no rescale by then: they become ordinary kills
        self._next_rescale_kill = 0.0
        bursts = -(-(kills - self.in_rescales) // BURST)
        spacing = (duration_s - 40) / bursts
        starts = [8 + b * spacing + self.rng.uniform(0, spacing / 3) for b in range(bursts)]
        self.kill_at = [start + 2.0 * k for b, start in enumerate(starts)
                        for k in range(min(BURST, kills - self.in_rescales - b * BURST))]
        self.redis_at = duration_s * 0.45
        self.controller_fault_by = duration_s * 0.6  # ask for a rescale if the autoscaler made none by then
        self.faults: list[dict] = []
        self.controller_restarts = 0
        self.redis_restarts = 0
        self.harness_errors: list[str] = []
        self.started: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, runtime, elapsed: float) -> None:
        if self._thread is None:
            self.started = time.monotonic() - elapsed
            runtime.rescale_fault = self._die_in_handover
            self._thread = threading.Thread(target=self._loop, args=(runtime,), daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict:
        kills = [f for f in self.faults if f["fault"] == "sigkill"]
        recoveries = [f["recovered_s"] for f in self.faults]
        return {
            "kills": len(kills),
            "kills_in_prestage": sum(f["phase"] == Phase.PRESTAGE for f in kills),
            "kills_in_handover": sum(f["phase"] == Phase.HANDOVER for f in kills),
            "controller_restarts": self.controller_restarts,
            "redis_restarts": self.redis_restarts,
            "aof_fsync": AOF_FSYNC,
            "unrecovered": sum(r is None for r in recoveries),
            "max_recovery_s": max((r for r in recoveries if r is not None), default=None),
            "faults": self.faults,
            "harness_errors": self.harness_errors,
        }

    # --- the faults ------------------------------------------------------------

    def _loop(self, runtime) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic() - self.started
            try:
                self._recoveries(runtime, now)
                rescale = runtime.jobs.rescale_state()
                if (self.in_rescales and rescale is not None and rescale.phase in (Phase.PRESTAGE, Phase.HANDOVER)
                        and now >= self._next_rescale_kill):
                    if self._kill(runtime, now, rescale):
                        self.in_rescales -= 1
                        self._next_rescale_kill = now + 4
                elif self.in_rescales and now >= self.spend_in_rescales_at:
                    self.kill_at = sorted([*self.kill_at, *(now + 2.0 * k for k in range(self.in_rescales))])
                    self.in_rescales = 0
                elif self.kill_at and now >= self.kill_at[0]:
                    if self._kill(runtime, now, rescale):
                        self.kill_at.pop(0)
                elif not self.redis_restarts and now >= self.redis_at and (
                        runtime.jobs.rescale_state() is None or now >= self.redis_at + 15):  # mid-rescale if it must
                    self._restart_redis(now)
                elif (not self.controller_restarts and now >= self.controller_fault_by
                      and runtime.jobs.rescale_state() is None):
                    self._ask_for_a_rescale(runtime)
            except redis.ConnectionError:
                continue  # Redis is down (restarting): the faults wait
            except Exception as exc:  # noqa: BLE001 - reported in the result, not lost with the thread
                self.harness_errors.append(f"{type(exc).__name__}: {exc}")

    def _kill(self, runtime, now: float, rescale: RescaleState | None) -> bool:
        """SIGKILL a random worker (while a rescale runs, one of its operator's); False if none was alive."""
        phase = rescale.phase.value if rescale else None
        targets = [("worker", key, inst) for key, inst in list(runtime.processes.instances.items())]
        if rescale is not None:  # some kills while a rescale prestages or hands over: aim at its operator
            op = rescale.operator
            targets = [t for t in targets if t[1][0] == op] + [
                ("standby", key, inst) for key, inst in list(runtime.processes.standbys.items()) if key[0] == op]
        alive = [t for t in targets if t[2].process.poll() is None]  # a dead one's restart is under way
        if not alive:
            return False
        kind, (op, index), inst = self.rng.choice(alive)
        inst.process.kill()
        self.faults.append({"fault": "sigkill", "t": round(now, 1), "target": f"{kind} {op}/{index}",
                            "phase": phase, "recovered_s": None})
        return True

    def _restart_redis(self, now: float) -> None:
        self.server.restart()
        self.redis_restarts += 1
        self.faults.append({"fault": "redis restart", "t": round(now, 1), "target": "redis-server",
                            "phase": None, "recovered_s": None})

    def _ask_for_a_rescale(self, runtime) -> None:
        """The controller's death needs a rescale to die in; when the load brought none, ask for one."""
        now = runtime.parallelism[STAGE]
        runtime.jobs.request_rescale(RescaleRequest(STAGE, now + 1 if now < 3 else now - 1))
        self.controller_fault_by += 20  # asked again if this one ends without the death (rolled back)

    def _die_in_handover(self, state: RescaleState | None) -> None:
        """The runtime's rescale controller calls this at each of its waits: the first in HANDOVER is its death."""
        if self.controller_restarts or state is None or state.phase != Phase.HANDOVER:
            return
        self.controller_restarts += 1
        self.faults.append({"fault": "controller death", "t": round(time.monotonic() - self.started, 1),
                            "target": f"rescale of {state.operator} {state.from_parallelism} -> {state.to_parallelism}",
                            "phase": Phase.HANDOVER.value, "recovered_s": None})
        raise ControllerDied("the rescale controller died mid-handover (injected)")

    def _recoveries(self, runtime, now: float) -> None:
        """A fault is recovered from when every instance runs and is registered again and no rescale is
        left half done (for the controller's death: its rescale finished)."""
        pending = [f for f in self.faults if f["recovered_s"] is None]
        if pending and _whole(runtime):
            for fault in pending:
                fault["recovered_s"] = round(now - fault["t"], 1)


def _whole(runtime) -> bool:
    registered = runtime.jobs.registered()
    return runtime.jobs.rescale_state() is None and all(
        inst.process.poll() is None and key in registered for key, inst in list(runtime.processes.instances.items()))


QUICK = (240.0, 20)
FULL = (600.0, 40)
# At its peak one instance of the stage (1 ms per bid, most events are bids) falls behind: the autoscaler
# has something to do. A marker-based handover waits for the old owner's backlog up to the marker, so a
# load far over capacity would make each rescale as long as that backlog takes to drain.
RECORDS_PER_S = 700


def run(duration_s: float, kills: int, seed: int = 1, records_per_s: int = RECORDS_PER_S,
        console: Console | None = None, marker_max_lag_records: int | None = None) -> dict:
    console = console or Console(force_terminal=False, quiet=True)
    with RedisServer(appendonly=True, extra=("--appendfsync", AOF_FSYNC)) as server:
        chaos = Chaos(server, kills, duration_s, seed)
        try:
            job = chaos_job(duration_s, records_per_s, marker_max_lag_records)
            report = run_job(job, duration_s, redis_url=server.url,
                             console=console, during=chaos)
        finally:
            chaos.stop()
    verification = report.get("verification", {})
    return {
        **chaos.summary(),
        "duration_s": duration_s,
        "worker_restarts": report["restarts"],
        "rescales": [{k: r.get(k) for k in ("operator", "from", "to", "strategy", "pause_ms",
                                                   "released_at_commit")}
                     for r in report["rescales"]],
        "dead_letters": report["dead_letters"],
        "lost": verification.get("lost"),
        "duplicated": verification.get("duplicated"),
        "correct": verification.get("correct"),
    }
