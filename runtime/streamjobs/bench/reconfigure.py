"""`streamjobs bench reconfigure`: what a live spec change costs, against stop-and-restart (ours and Flink's).

A keyed window job runs at steady load on the local runtime: zipf words, a SQL
stage `shape` (on its own workers, or chained after the sources), a 1 s
tumbling count per word, a sink. Its
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

`rebalance`: a skewed job (Zipf words, the hottest key groups all on instance
0 of a window stage with a simulated per-record cost that dominates its busy
time) is rebalanced by load (rebalance.py) at the same parallelism, batched;
`busiest_busy_share_before` and `_after` are the busiest instance's busy share
(busy / (busy + idle), from its /metrics) over the stretch before and after.
Its baseline moves the same key groups by stop and restart (`restart`
strategy).

A change's steady stretch is checked for being steady: `steady` is false when
its median latency moved by more than STEADY_DRIFT_MS from its first half to
its second (`steady_drift_ms`: up, the job was falling behind; down, it was
still draining a backlog), and then `max_latency_over_steady_p99` is null
rather than a ratio against a p99 that was still moving.

`add_stage`: the same job with `shape` chained after the sources gets a SQL
stage (a filter) added after `shape`, in the same chain (reconfigure.py: the
graph changes inside a chain); from the switch on, the window reads its input
from the new stage's streams. Flink's figure is the same restart at the same
state size.
"""

from __future__ import annotations

import time
import urllib.request
from collections import defaultdict

import numpy as np
import redis
from rich.console import Console
from streamjobs_autoscaler.collect import OperatorCounters, add_exposition
from streamjobs_core import generators
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.keygroups import Assignment, key_groups_of
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import parse_job
from streamjobs_core.rebalance import balanced
from streamjobs_core.rebalance import measure as measure_load
from streamjobs_core.spec import StreamJob

from ..redis_server import RedisServer
from ..run import run_job
from . import flink_peer
from .rescale import Bench, drift_ms, held_up_ms, latency_by_time, outputs_by_key_group, per_bin, state_bytes

# At 2,000 words/s two of three runs on 2 cores never settled: the backlog built while the JVMs warmed up was
# still draining when the change came (steady p99 4-18 s against 2 s in a run that settled).
RATE = 1000
SHAPE, STAGE, SINK = "shape", "count", "counts"
BEFORE = "SELECT word, event_time, _ingest_ms FROM input"
AFTER = "SELECT upper(word) AS word, event_time, _ingest_ms FROM input WHERE word <> 'w1'"
_AFTER_S = 10.0
# How much the steady stretch's median latency may move from its first half to its second for the stretch to
# count as steady: a rise is a job falling behind its input, a fall one still draining a backlog; either way a
# ratio against its p99 says nothing.
STEADY_DRIFT_MS = 500.0


# Added after `shape` when `shape` runs chained after the sources: it joins their chain, whose workers run
# Spark already, and the window's input streams come from it from the switch on.
ADDED = {"name": "enrich", "type": "sql", "inputs": [SHAPE], "parallelism": 2,
         "query": "SELECT word, event_time, _ingest_ms FROM input WHERE length(word) > 2"}


def bench_job(name: str, query: str = BEFORE, added: tuple[dict, ...] = (), chained: bool = False) -> StreamJob:
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "vocabulary": 4000, "exponent": 0.8, "outOfOrderMs": 100,
                         "parallelism": 2, "rate": {"profile": "constant", "recordsPerSecond": RATE}}],
            "stages": [
                # Unless chained, its own workers: its input comes through streams, so it aligns barriers
                # from both sources.
                {"name": SHAPE, "type": "sql", "inputs": ["words"], "chain": chained, "parallelism": 2,
                 "query": query},
                *added,
                {"name": STAGE, "type": "window_aggregate", "inputs": [added[-1]["name"] if added else SHAPE],
                 "keyBy": "word", "parallelism": 2, "window": {"type": "tumbling", "sizeMs": 1000},
                 "aggregations": [{"function": "count", "as": "n"}]},
            ],
            "sinks": [{"name": SINK, "type": "redis_stream", "inputs": [STAGE]}],
        },
    })


# Per change: the job before it, and after it.
CHANGES = {"swap_sql": ({}, {"query": AFTER}),
           "add_stage": ({"chained": True}, {"chained": True, "added": (ADDED,)})}


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


def observe(job: StreamJob, hook, steady_back_s: float, console: Console, prepare=None) -> dict:
    """Run `job` with `hook` (a Changer or Rebalancer: its `done` says when its change started and ended); what
    the sinks committed around the change against the `steady_back_s` before it, and the oracle's verdict."""
    with RedisServer() as server:
        report = run_job(job, None, redis_url=server.url, console=console, during=hook, prepare=prepare)
        r = redis.Redis.from_url(server.url)
        keys = JobKeys(job.metadata.name)
        lat_t, lat_v = latency_by_time(r, keys)
        out_t, out_kg, out_latency = outputs_by_key_group(r, keys, Bench(job, STAGE, SINK, "word"))
        r.close()
    verification = report.get("verification") or {}
    start, end = hook.done["start_ms"], hook.done["end_ms"]
    steady_from = max(float(lat_t.min()), start - steady_back_s * 1000)
    steady = lat_v[(lat_t >= steady_from) & (lat_t < start)]
    steady_out = (out_t >= steady_from) & (out_t < start)
    usual = float(np.median(out_latency[steady_out])) if steady_out.any() else 0.0
    all_kgs = list(range(job.spec.max_parallelism))
    after = lat_v[(lat_t >= start) & (lat_t <= end + _AFTER_S * 1000)]
    drift = drift_ms(lat_t, lat_v, steady_from, start)
    return {
        "steady_p99_ms": float(np.percentile(steady, 99)) if len(steady) else None,
        "steady_drift_ms": drift, "steady": drift is not None and abs(drift) <= STEADY_DRIFT_MS,
        "steady_result_latency_p50_ms": usual,
        # The same measure as pause_ms over the steady stretch: how late results come with no change at all.
        "steady_pause_ms": held_up_ms(out_t, out_kg, out_latency, all_kgs, steady_from, start, usual),
        "max_latency_ms": float(after.max()) if len(after) else None,
        "pause_ms": held_up_ms(out_t, out_kg, out_latency, all_kgs, start - 1000, end + _AFTER_S * 1000, usual),
        "lost": verification.get("lost"), "duplicated": verification.get("duplicated"),
        "correct": verification.get("correct"), "restarts": report["restarts"],
        "timeline": per_bin(lat_t, lat_v, steady_from, end + _AFTER_S * 1000),
    }


def measure(change: str, restart: bool, steady_s: float, console: Console) -> dict:
    before, after = CHANGES[change]
    job = bench_job(f"bench-{change.replace('_', '-')}-{'restart' if restart else 'live'}", **before)
    changer = Changer(bench_job(job.metadata.name, **after), restart, steady_s)
    observed = observe(job, changer, steady_s / 2, console)
    done = changer.done
    return {**observed, "aligned_ms": done["record"].pause_ms,
            "change_s": round((done["end_ms"] - done["start_ms"]) / 1000, 2), "state_bytes": done["state_bytes"]}


# Per-record work (a simulated 4 ms, as of a model scored per record) dominates each instance's busy time, as in
# the jobs a rebalance is for; 2 s windows, run once a second, keep Spark's per-batch fixed cost the smaller part.
SKEWED_RATE, SKEWED_COST_US, SKEWED_PARALLELISM, SKEWED_WINDOW_MS = 300, 4000, 4, 2000


def skewed_job(name: str) -> StreamJob:
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "vocabulary": 2000, "exponent": 0.9, "outOfOrderMs": 100,
                         "rate": {"profile": "constant", "recordsPerSecond": SKEWED_RATE}}],
            "stages": [{"name": STAGE, "type": "window_aggregate", "inputs": ["words"], "keyBy": "word",
                        "parallelism": SKEWED_PARALLELISM, "simulatedCostUs": SKEWED_COST_US,
                        "window": {"type": "tumbling", "sizeMs": SKEWED_WINDOW_MS},
                        "aggregations": [{"function": "count", "as": "n"}]}],
            "sinks": [{"name": SINK, "type": "redis_stream", "inputs": [STAGE]}],
            "batching": {"minIntervalMs": 1000},
        },
    })


def hot_first(share: float = 0.6):
    """`prepare` hook: the key groups holding `share` of the generated records, hottest first, all owned by
    instance 0 of the stage; the rest spread over the others in ranges (a skew no count-based assignment
    would undo)."""

    def prepare(r, plan) -> None:
        spec = plan.spec.operator("words")
        words = generators.generate(spec, plan.t0_ms, np.arange(50_000, dtype=np.int64)).column("word")
        kgs = plan.key_groups(STAGE)
        load = np.bincount(key_groups_of(np.asarray(words.to_pylist(), dtype=object), kgs), minlength=kgs)
        order = np.argsort(-load, kind="stable")
        hot = order[: int(np.searchsorted(np.cumsum(load[order]), share * load.sum())) + 1]
        n = plan.spec.operator(STAGE).parallelism
        rest = [kg for kg in range(kgs) if kg not in set(hot.tolist())]
        owners = [0] * kgs
        for i, kg in enumerate(rest):
            owners[kg] = 1 + i * (n - 1) // len(rest)
        RedisJobStore(r, plan.id).write_assignment(STAGE, Assignment(1, tuple(owners)))

    return prepare


def busy_shares(store, op: str, window_s: float) -> dict[int, float]:
    """Per instance of `op`: busy / (busy + idle) over `window_s`, from two scrapes of its /metrics."""
    def scrape() -> dict[int, OperatorCounters]:
        out = {}
        for (name, instance), address in store.registered().items():
            if name == op:
                counters: dict[str, OperatorCounters] = defaultdict(OperatorCounters)
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as response:
                    add_exposition(counters, response.read().decode())
                out[instance] = counters[op]
        return out

    first = scrape()
    time.sleep(window_s)
    last = scrape()
    shares = {}
    for instance in first.keys() & last.keys():
        busy = last[instance].busy_s - first[instance].busy_s
        idle = last[instance].idle_s - first[instance].idle_s
        shares[instance] = round(busy / (busy + idle), 4) if busy + idle > 0 else 0.0
    return shares


class Rebalancer:
    """`during` hook: steady, busy shares, a rebalance by load, busy shares again, stop."""

    def __init__(self, strategy: str, steady_s: float) -> None:
        self.strategy = strategy
        self.steady_s = steady_s
        self.done: dict | None = None

    def __call__(self, runtime, elapsed: float) -> None:
        if self.done is not None or elapsed < self.steady_s:
            return
        window = self.steady_s / 2
        before = busy_shares(runtime.jobs, STAGE, window)
        current = runtime.jobs.assignment(STAGE)
        balance = balanced(current, measure_load(runtime.control, runtime.plan, STAGE, window))
        start = time.time() * 1000
        record = runtime.rescale(STAGE, current.parallelism, self.strategy, balance.owners)
        end = time.time() * 1000
        time.sleep(window)  # the moved key groups' owners settle in
        after = busy_shares(runtime.jobs, STAGE, window)
        self.done = {"record": record, "start_ms": start, "end_ms": end, "before": before, "after": after,
                     "balance": balance.as_dict(), "moved": sum(a != b for a, b in zip(current.owners, balance.owners))}
        runtime.request_stop()


def measure_rebalance(strategy: str, steady_s: float, console: Console) -> dict:
    job = skewed_job(f"bench-rebalance-{strategy.replace('_', '-')}")
    rebalancer = Rebalancer(strategy, steady_s)
    observed = observe(job, rebalancer, steady_s, console, prepare=hot_first())
    done = rebalancer.done
    return {
        **{k: v for k, v in observed.items() if k != "timeline"},
        "busy_shares_before": done["before"], "busy_shares_after": done["after"],
        "busiest_busy_share_before": max(done["before"].values()),
        "busiest_busy_share_after": max(done["after"].values()),
        "load_shares": done["balance"], "moved_key_groups": done["moved"],
        "rescale_s": done["record"].rescale_s,
    }


def run(quick: bool) -> dict:
    console = Console(force_terminal=False, quiet=True)
    steady_s = 20.0 if quick else 40.0
    runs = {f"{change}_{how}": measure(change, how == "restart", steady_s, console)
            for change in CHANGES for how in ("live", "restart")}
    flink = None
    if flink_peer.installed():
        flink = flink_peer.measure_restart(max(1.0, runs["swap_sql_live"]["state_bytes"] / 1e6), 2, 2)
    # Twice as long before a rebalance: busy shares fall while the JVMs warm up, which is not the rebalance's doing.
    balanced_live = measure_rebalance("batched", 2 * steady_s, console)
    balanced_restart = measure_rebalance("restart", 2 * steady_s, console)
    changes = {change: _figures(runs[f"{change}_live"], runs[f"{change}_restart"], flink) for change in CHANGES}
    before, after = balanced_live["busiest_busy_share_before"], balanced_live["busiest_busy_share_after"]
    rebalance = {
        "max_latency_ms": balanced_live["max_latency_ms"], "pause_ms": balanced_live["pause_ms"],
        "restart_pause_ms": balanced_restart["pause_ms"],
        "flink_restart_pause_ms": flink["flink_restart_pause_ms"] if flink else None,
        "lost": balanced_live["lost"], "duplicated": balanced_live["duplicated"],
        "correct": balanced_live["correct"],
        "busiest_busy_share_before": before, "busiest_busy_share_after": after,
        "busiest_busy_share_lowered_by": round(1 - after / before, 3) if before else None,
        "steady_p99_ms": balanced_live["steady_p99_ms"], "steady": balanced_live["steady"],
        "steady_drift_ms": balanced_live["steady_drift_ms"],
        "max_latency_over_steady_p99": _over_steady(balanced_live),
        "restart_pause_over_live": _ratio(balanced_restart["pause_ms"], max(balanced_live["pause_ms"], 1.0)),
    }
    return {
        "rate_records_per_s": RATE,
        "steady_p99_ms": runs["swap_sql_live"]["steady_p99_ms"],
        "changes": {**changes, "rebalance": rebalance},
        "runs": {**runs, "rebalance": balanced_live, "rebalance_restart": balanced_restart},
        "flink": flink,
    }


def _figures(live: dict, restart: dict, flink: dict | None) -> dict:
    return {
        "steady_p99_ms": live["steady_p99_ms"], "steady": live["steady"], "steady_drift_ms": live["steady_drift_ms"],
        "max_latency_ms": live["max_latency_ms"], "pause_ms": live["pause_ms"], "aligned_ms": live["aligned_ms"],
        "restart_pause_ms": restart["pause_ms"],
        "flink_restart_pause_ms": flink["flink_restart_pause_ms"] if flink else None,
        "lost": live["lost"], "duplicated": live["duplicated"], "correct": live["correct"],
        "restart_lost": restart["lost"], "restart_duplicated": restart["duplicated"],
        "restart_correct": restart["correct"],
        "max_latency_over_steady_p99": _over_steady(live),
        # The live change's pause can be within the noise of steady results (steady_pause_ms): floored at 1 ms.
        "restart_pause_over_live": _ratio(restart["pause_ms"], max(live["pause_ms"], 1.0)),
        "flink_restart_pause_over_live": _ratio(flink["flink_restart_pause_ms"], max(live["pause_ms"], 1.0))
        if flink else None,
    }


def _over_steady(live: dict) -> float | None:
    """Max latency around the change over the steady p99; none where the stretch before it was not steady."""
    return _ratio(live["max_latency_ms"], live["steady_p99_ms"]) if live["steady"] else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None
