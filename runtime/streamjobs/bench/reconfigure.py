"""`streamjobs bench reconfigure`: what a live spec change costs, against stop-and-restart (ours and Flink's).

A keyed window job runs at steady load on the local runtime: zipf words, a SQL
stage `shape` on its own workers, a 1 s tumbling count per word, a sink. Its
SQL is swapped (`swap_sql`) once, live (reconfigure.py: barriers from the
sources, aligned per instance, one commit that switches), and in a second run
of the same job by stop and restart on the new plan (every worker stops after
its last commit, then the job starts again: our stop-savepoint-restart, whose
savepoint is the committed state). Flink's own stop-with-savepoint and restart
is measured in the same run (flink_peer.py) at the job's state size.

Per change, from what the sinks committed (bench/rescale.py's measures):
`max_latency_ms` of the latency samples from the change until 10 s after it,
against the steady p99 before it; `pause_ms`, how much later than the steady
median the latest window result of any key group came around the change (the
time results were held up); `aligned_ms`, the longest an instance held its
input back for barriers (the worker's own figure); `lost`, `duplicated` and
`correct` from the oracle, which replays each record under the plan in force
at its source offset.

Adding a stage and the skew-aware rebalance are not built yet: they are listed
under `not_measured`, not given figures.
"""

from __future__ import annotations

import time

import numpy as np
import redis
from rich.console import Console
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import parse_job
from streamjobs_core.spec import StreamJob

from ..redis_server import RedisServer
from ..run import run_job
from . import flink_peer
from .rescale import Bench, held_up_ms, latency_by_time, outputs_by_key_group, per_bin, state_bytes

RATE = 2000
SHAPE, STAGE, SINK = "shape", "count", "counts"
BEFORE = "SELECT word, event_time, _ingest_ms FROM input"
AFTER = "SELECT upper(word) AS word, event_time, _ingest_ms FROM input WHERE word <> 'w1'"
_AFTER_S = 10.0


def bench_job(name: str, query: str = BEFORE) -> StreamJob:
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "vocabulary": 4000, "exponent": 0.8, "outOfOrderMs": 100,
                         "parallelism": 2, "rate": {"profile": "constant", "recordsPerSecond": RATE}}],
            "stages": [
                # Its own workers: its input comes through streams, so it aligns barriers from both sources.
                {"name": SHAPE, "type": "sql", "inputs": ["words"], "chain": False, "parallelism": 2,
                 "query": query},
                {"name": STAGE, "type": "window_aggregate", "inputs": [SHAPE], "keyBy": "word", "parallelism": 2,
                 "window": {"type": "tumbling", "sizeMs": 1000}, "aggregations": [{"function": "count", "as": "n"}]},
            ],
            "sinks": [{"name": SINK, "type": "redis_stream", "inputs": [STAGE]}],
        },
    })


class Changer:
    """`during` hook: steady, the change, steady, stop; the change timed on the wall clock."""

    def __init__(self, new: StreamJob, restart: bool, steady_s: float) -> None:
        self.new = new
        self.restart = restart
        self.steady_s = steady_s
        self.done: dict | None = None
        self._ended_at: float | None = None

    def __call__(self, runtime, elapsed: float) -> None:
        if self.done is None and elapsed >= self.steady_s:
            state = state_bytes(runtime.r, runtime.keys, list(range(runtime.plan.spec.max_parallelism)), STAGE)
            start = time.time() * 1000
            record = runtime.reconfigure(self.new, restart=self.restart)
            self.done = {"record": record, "start_ms": start, "end_ms": time.time() * 1000, "state_bytes": state}
            self._ended_at = elapsed
        elif self._ended_at is not None and elapsed - self._ended_at >= self.steady_s:
            runtime.request_stop()


def measure(restart: bool, steady_s: float, console: Console) -> dict:
    job = bench_job(f"bench-reconfigure-{'restart' if restart else 'live'}")
    changer = Changer(bench_job(job.metadata.name, AFTER), restart, steady_s)
    with RedisServer() as server:
        report = run_job(job, None, redis_url=server.url, console=console, during=changer)
        r = redis.Redis.from_url(server.url)
        keys = JobKeys(job.metadata.name)
        lat_t, lat_v = latency_by_time(r, keys)
        out_t, out_kg, out_latency = outputs_by_key_group(r, keys, Bench(job, STAGE, SINK, "word"))
        r.close()
    verification = report.get("verification") or {}
    done = changer.done
    start, end = done["start_ms"], done["end_ms"]
    steady_from = max(float(lat_t.min()), start - steady_s * 1000 / 2)
    steady = lat_v[(lat_t >= steady_from) & (lat_t < start)]
    steady_out = (out_t >= steady_from) & (out_t < start)
    usual = float(np.median(out_latency[steady_out])) if steady_out.any() else 0.0
    all_kgs = list(range(job.spec.max_parallelism))
    after = lat_v[(lat_t >= start) & (lat_t <= end + _AFTER_S * 1000)]
    record = done["record"]
    return {
        "steady_p99_ms": float(np.percentile(steady, 99)) if len(steady) else None,
        "steady_result_latency_p50_ms": usual,
        # The same measure as pause_ms over the steady stretch: how late results come with no change at all.
        "steady_pause_ms": held_up_ms(out_t, out_kg, out_latency, all_kgs, steady_from, start, usual),
        "max_latency_ms": float(after.max()) if len(after) else None,
        "pause_ms": held_up_ms(out_t, out_kg, out_latency, all_kgs, start - 1000, end + _AFTER_S * 1000, usual),
        "aligned_ms": record.pause_ms,
        "change_s": round((end - start) / 1000, 2),
        "state_bytes": done["state_bytes"],
        "lost": verification.get("lost"), "duplicated": verification.get("duplicated"),
        "correct": verification.get("correct"), "restarts": report["restarts"],
        "timeline": per_bin(lat_t, lat_v, steady_from, end + _AFTER_S * 1000),
    }


def run(quick: bool) -> dict:
    console = Console(force_terminal=False, quiet=True)
    steady_s = 20.0 if quick else 40.0
    live = measure(False, steady_s, console)
    restart = measure(True, steady_s, console)
    flink = None
    if flink_peer.installed():
        flink = flink_peer.measure_restart(max(1.0, live["state_bytes"] / 1e6), 2, 2)
    swap = {
        "max_latency_ms": live["max_latency_ms"], "pause_ms": live["pause_ms"], "aligned_ms": live["aligned_ms"],
        "restart_pause_ms": restart["pause_ms"],
        "flink_restart_pause_ms": flink["flink_restart_pause_ms"] if flink else None,
        "lost": live["lost"], "duplicated": live["duplicated"], "correct": live["correct"],
        "restart_lost": restart["lost"], "restart_duplicated": restart["duplicated"],
        "restart_correct": restart["correct"],
        "max_latency_over_steady_p99": _ratio(live["max_latency_ms"], live["steady_p99_ms"]),
        # The live change's pause can be within the noise of steady results (steady_pause_ms): floored at 1 ms.
        "restart_pause_over_live": _ratio(restart["pause_ms"], max(live["pause_ms"], 1.0)),
        "flink_restart_pause_over_live": _ratio(flink["flink_restart_pause_ms"], max(live["pause_ms"], 1.0))
        if flink else None,
    }
    return {
        "rate_records_per_s": RATE,
        "steady_p99_ms": live["steady_p99_ms"],
        "changes": {"swap_sql": swap},
        "not_measured": {"add_stage": "adding a stage live is not built yet",
                         "rebalance": "the skew-aware rebalance is not built yet"},
        "runs": {"live": live, "restart": restart},
        "flink": flink,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None
