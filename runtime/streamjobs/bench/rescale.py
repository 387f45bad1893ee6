"""`streamjobs bench rescale`: what a live rescale costs, per strategy, against stop-and-restart.

A stateful window job runs at steady load on the local runtime; its window
stage scales out 2 -> 4 and back in 4 -> 2 with each strategy. Everything is
read back from Redis after the run, per 100 ms: end-to-end latency (the sinks'
samples) and output records. A moved key group's pause (`pause_ms`) is how much
later than usual its results reached the sink around the rescale: the largest
(commit time - window end) of a moved key group's output, less the steady
median of that latency over all key groups. It is the time the key group was
held up by the move, as Flink's `flink_restart_pause_ms` is the time every key
group is held up by a stop-with-savepoint and restart (measured in the same
run, flink_peer.py, at the same state size). `output_gap_ms` is the longest
stretch without output of a moved key group, which with 1 s windows is never
below the ~1-2 s between a key group's results (`steady_output_gap_ms`).
State size is set with ballast: window state in windows that never fire
(they start beyond any watermark), written as snapshots before the workers
start, so it is restored, prestaged and moved like any other state.

The same is measured for a join (`join`): NEXMark Q8's window join (persons
with the sellers of the same 1 s window, a left join so that every person
comes out) scaled 2 -> 4 -> 2, whose moved key groups carry both inputs'
buffered rows.

For fluid and batched, `handover_ms` is the longest step: the time from a
step's markers (or, for a backlogged old owner, release requests) to its key
groups' take-over, which bounds what one moved key group waits;
`released_at_commit` counts the key groups moved without a marker. For
all_at_once and restart it is the whole switch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import redis
from rich.console import Console
from streamjobs_core.exchange import Transaction
from streamjobs_core.exchange.redis_exchange import apply
from streamjobs_core.keygroups import Assignment, key_groups_of, moves
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import parse_job
from streamjobs_core.spec import StreamJob
from streamjobs_core.watermarks import MAX_WATERMARK
from streamjobs_worker.recovery import write_snapshot
from streamjobs_worker.stages.window import window_state_rows

from ..redis_server import RedisServer
from ..run import run_job

STAGE, SINK = "count", "counts"
JOIN_STAGE, JOIN_SINK = "new-users", "monitored"
MEASURED = ("all_at_once", "fluid", "batched", "restart")
BIN_MS = 100
RATE = 2000
BALLAST_ROW_BYTES = 1024
_AFTER_S = 10.0  # how long after a rescale its effects on latency are counted


def bench_job(name: str) -> StreamJob:
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "vocabulary": 4000, "exponent": 0.8, "outOfOrderMs": 100,
                         "rate": {"profile": "constant", "recordsPerSecond": RATE}}],
            "stages": [{"name": STAGE, "type": "window_aggregate", "inputs": ["words"], "keyBy": "word",
                        "parallelism": 2, "window": {"type": "tumbling", "sizeMs": 1000},
                        "aggregations": [{"function": "count", "as": "n"}]}],
            "sinks": [{"name": SINK, "type": "redis_stream", "inputs": [STAGE]}],
            # Rare snapshots: each one rewrites the ballast of every key group it covers.
            "state": {"snapshotEveryBatches": 200},
            # The scale-out's two new instances are warm spares (restart stops and starts every instance).
            "rescale": {"spareInstances": 2},
        },
    })


@dataclass(frozen=True)
class Bench:
    """A job to rescale: which stage moves, where its output goes, which output column names its key."""

    job: StreamJob
    stage: str
    sink: str
    key: str
    prepare: Callable | None = None


def window_bench(name: str, state_mb: float) -> Bench:
    return Bench(bench_job(name), STAGE, SINK, "word", ballast(state_mb))


def join_bench(name: str) -> Bench:
    """NEXMark Q8's join (examples/nexmark-q8.yaml) with 1 s windows, left outer: every person comes out."""
    job = parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "events", "type": "nexmark", "seed": 8, "outOfOrderMs": 100,
                         "rate": {"profile": "constant", "recordsPerSecond": RATE}}],
            "stages": [
                {"name": "persons", "type": "sql", "inputs": ["events"],
                 "query": "SELECT person_id, person_name, event_time, _ingest_ms FROM input WHERE event_type = 0"},
                {"name": "sellers", "type": "window_aggregate", "inputs": ["events"], "where": "event_type = 1",
                 "keyBy": "auction_seller", "window": {"type": "tumbling", "sizeMs": 1000},
                 "aggregations": [{"function": "count", "as": "auctions"}]},
                {"name": JOIN_STAGE, "type": "join", "inputs": ["persons", "sellers"], "how": "left",
                 "on": {"left": ["person_id"], "right": ["auction_seller"]}, "parallelism": 2,
                 "window": {"type": "tumbling", "sizeMs": 1000},
                 "select": ["l.person_id AS id", "l.person_name AS name", "r.auctions AS auctions"]},
            ],
            "sinks": [{"name": JOIN_SINK, "type": "redis_stream", "inputs": [JOIN_STAGE]}],
            # No spares: every operator would keep its own (six more JVMs on two cores).
        },
    })
    return Bench(job, JOIN_STAGE, JOIN_SINK, "id")


def ballast(state_mb: float):
    """`prepare` hook: `state_mb` MB of never-firing window state, spread over the stage's key groups:
    rows of long keys in the window that starts at MAX_WATERMARK."""

    def prepare(r, plan) -> None:
        key_groups = plan.key_groups(STAGE)
        per_kg = max(1, int(state_mb * 1e6 / BALLAST_ROW_BYTES / key_groups))
        spec = plan.spec.operator(STAGE)
        for kg in range(key_groups):
            keys = pa.array([f"~ballast-{kg}-{i}-".ljust(BALLAST_ROW_BYTES, "~") for i in range(per_kg)])
            txn = Transaction()
            write_snapshot(txn, plan.keys, STAGE, kg, b"0-1", window_state_rows(spec, keys, MAX_WATERMARK))
            apply(r, txn, lambda kg: plan.keys.changelog(STAGE, kg))

    return prepare


def state_bytes(r, keys, kgs: list[int], stage: str = STAGE) -> int:
    """Durable state of these key groups: snapshot plus changelog tail, as Redis stores them."""
    pipe = r.pipeline(transaction=False)
    for kg in kgs:
        pipe.strlen(keys.snapshot(stage, kg))
        pipe.memory_usage(keys.changelog(stage, kg))
    return sum(int(v or 0) for v in pipe.execute())


class Rescaler:
    """`during` hook: steady, scale out, steady, scale in, steady, stop; times every rescale on the wall clock."""

    def __init__(self, stage: str, strategy: str, steps: list[int], steady_s: float) -> None:
        self.stage = stage
        self.strategy = strategy
        self.steps = list(steps)
        self.steady_s = steady_s
        self.rescales: list[dict] = []
        self._last_end = 0.0

    def __call__(self, runtime, elapsed: float) -> None:
        if elapsed - self._last_end < self.steady_s:
            return
        if not self.steps:
            runtime.request_stop()
            return
        to = self.steps.pop(0)
        current = runtime.parallelism[self.stage]
        key_groups = runtime.plan.key_groups(self.stage)
        moved = [m.key_group for m in moves(Assignment.ranges(current, key_groups), Assignment.ranges(to, key_groups))]
        before = state_bytes(runtime.r, runtime.keys, moved, self.stage)
        started_ms = time.time() * 1000
        record = runtime.rescale(self.stage, to, self.strategy)
        self.rescales.append({"record": record, "moved": moved, "bytes_moved": before,
                              "start_ms": started_ms, "end_ms": time.time() * 1000})
        self._last_end = elapsed + record.rescale_s


def latency_by_time(r, keys) -> tuple[np.ndarray, np.ndarray]:
    """(time ms, latency ms) of every sample the sinks wrote."""
    times, values = [], []
    for _, fields in r.xrange(keys.latency_samples):
        sample = msgpack.unpackb(fields[b"l"])
        times.extend([int(fields[b"t"])] * len(sample))
        values.extend(sample)
    return np.asarray(times, dtype=np.int64), np.asarray(values, dtype=np.float64)


def outputs_by_key_group(r, keys, bench: Bench) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time ms, key group, latency ms) of every output record: when the sink committed it, and that less
    its window's end."""
    times, values, ends = [], [], []
    for entry_id, fields in r.xrange(keys.output_stream(bench.sink)):
        times.append(int(entry_id.split(b"-")[0]))
        values.append(fields[bench.key.encode()].decode())
        ends.append(int(fields[b"window_end"]))
    # The sink writes text: a key is hashed as the stage hashed it (an integer key as an integer).
    integral = values and all(v.lstrip("-").isdigit() for v in values)
    column = np.asarray(values, dtype=np.int64) if integral else np.asarray(values, dtype=object)
    groups = key_groups_of(column, bench.job.spec.max_parallelism) if values else np.zeros(0, dtype=np.int64)
    times = np.asarray(times, dtype=np.int64)
    return times, groups, (times - np.asarray(ends, dtype=np.int64)).astype(np.float64)


def held_up_ms(times: np.ndarray, groups: np.ndarray, latency: np.ndarray, kgs: list[int], start_ms: float,
               end_ms: float, usual_ms: float) -> float:
    """How much later than `usual_ms` the latest result of any of `kgs` committed within [start, end] came."""
    chosen = np.isin(groups, kgs) & (times >= start_ms) & (times <= end_ms)
    return max(0.0, float(latency[chosen].max()) - usual_ms) if chosen.any() else 0.0


def drift_ms(times: np.ndarray, values: np.ndarray, start_ms: float, end_ms: float) -> float | None:
    """How much the median of `values` moved from the first half of [start, end) to the second (up: positive):
    a job keeping up with its input drifts by noise only, one falling behind rises, one draining a backlog falls."""
    middle = (start_ms + end_ms) / 2
    early = values[(times >= start_ms) & (times < middle)]
    late = values[(times >= middle) & (times < end_ms)]
    if not len(early) or not len(late):
        return None
    return float(np.median(late) - np.median(early))


def longest_gap_ms(times: np.ndarray, start_ms: float, end_ms: float) -> float:
    """The longest stretch within [start, end] without an event at `times` (the edges count as events)."""
    inside = np.sort(times[(times >= start_ms) & (times <= end_ms)]).astype(np.float64)
    edges = np.concatenate([[start_ms], inside, [end_ms]])
    return float(np.diff(edges).max())


def output_gap_ms(times: np.ndarray, groups: np.ndarray, kgs: list[int], start_ms: float, end_ms: float) -> float:
    """The longest stretch without output for any of `kgs` within [start, end]."""
    return max((longest_gap_ms(times[groups == kg], start_ms, end_ms) for kg in kgs), default=0.0)


def per_bin(times: np.ndarray, values: np.ndarray, start_ms: float, end_ms: float) -> list[dict]:
    """Per 100 ms: latency p50/p99/max of the samples in it and how many there were."""
    rows = []
    edges = np.arange(start_ms, end_ms + BIN_MS, BIN_MS)
    index = np.digitize(times, edges) - 1
    for i in range(len(edges) - 1):
        chosen = values[index == i]
        row = {"t_s": round((edges[i] - start_ms) / 1000, 1), "samples": int(len(chosen))}
        if len(chosen):
            p50, p99 = np.percentile(chosen, [50, 99])
            row.update(p50_ms=float(p50), p99_ms=float(p99), max_ms=float(chosen.max()))
        rows.append(row)
    return rows


def measure(bench: Bench, strategy: str, steps: list[int], steady_s: float, state_mb: float | None,
            console: Console) -> dict:
    job = bench.job
    rescaler = Rescaler(bench.stage, strategy, steps, steady_s)
    with RedisServer() as server:
        report = run_job(job, None, redis_url=server.url, console=console, during=rescaler, prepare=bench.prepare)
        r = redis.Redis.from_url(server.url)
        keys = JobKeys(job.metadata.name)
        lat_t, lat_v = latency_by_time(r, keys)
        out_t, out_kg, out_latency = outputs_by_key_group(r, keys, bench)
        r.close()
    verification = report.get("verification", {})
    first_ms = rescaler.rescales[0]["start_ms"]
    steady_from = max(float(lat_t.min()) if len(lat_t) else first_ms, first_ms - steady_s * 1000 / 2)
    steady = lat_v[(lat_t >= steady_from) & (lat_t < first_ms)]
    all_kgs = list(range(job.spec.max_parallelism))
    steady_out = (out_t >= steady_from) & (out_t < first_ms)
    usual = float(np.median(out_latency[steady_out])) if steady_out.any() else 0.0
    result = {
        "state_mb": state_mb,
        "steady_p99_ms": float(np.percentile(steady, 99)) if len(steady) else None,
        "steady_result_latency_p50_ms": usual,
        # The same measure as pause_ms over the steady stretch: how late results come without any rescale.
        "steady_pause_ms": held_up_ms(out_t, out_kg, out_latency, all_kgs, steady_from, first_ms, usual),
        "steady_output_gap_ms": output_gap_ms(out_t, out_kg, all_kgs, steady_from, first_ms),
        "lost": verification.get("lost"), "duplicated": verification.get("duplicated"),
        "correct": verification.get("correct"), "restarts": report["restarts"],
        "rescales": [],
    }
    for done in rescaler.rescales:
        record, start, end = done["record"], done["start_ms"], done["end_ms"]
        window = (lat_t >= start) & (lat_t <= end + _AFTER_S * 1000)
        chosen = lat_v[window]
        result["rescales"].append({
            "from": record.from_parallelism, "to": record.to_parallelism,
            "max_latency_ms": float(chosen.max()) if len(chosen) else None,
            "p99_latency_ms": float(np.percentile(chosen, 99)) if len(chosen) else None,
            "pause_ms": held_up_ms(out_t, out_kg, out_latency, done["moved"], start - 1000, end + _AFTER_S * 1000,
                                   usual),
            "output_gap_ms": output_gap_ms(out_t, out_kg, done["moved"], start - 1000, end + _AFTER_S * 1000),
            "rescale_s": record.rescale_s, "handover_ms": record.pause_ms,
            "moved_key_groups": len(done["moved"]), "bytes_moved": done["bytes_moved"],
            "released_at_commit": record.released_at_commit,  # fluid/batched: not at a marker
            "start_s": round((start - steady_from) / 1000, 1), "end_s": round((end - steady_from) / 1000, 1),
        })
    end_ms = rescaler.rescales[-1]["end_ms"] + _AFTER_S * 1000
    result["timeline"] = per_bin(lat_t, lat_v, steady_from, end_ms)
    result["output_per_100ms"] = np.histogram(out_t, bins=np.arange(steady_from, end_ms + BIN_MS, BIN_MS))[0].tolist()
    return result


JOIN_MEASURED = ("all_at_once", "batched")  # Megaphone's two: the state moved at once, or step by step


def _name(prefix: str, strategy: str) -> str:
    return f"{prefix}-{strategy.replace('_', '-')}"


def summary(measured: dict) -> dict:
    """The issue's per-strategy figures: the worse of scale-out and scale-in."""
    rows = measured["rescales"]

    def worst(key: str):
        values = [row[key] for row in rows if row[key] is not None]
        return max(values) if values else None

    return {key: worst(key) for key in ("max_latency_ms", "p99_latency_ms", "pause_ms", "output_gap_ms", "rescale_s",
                                         "handover_ms", "bytes_moved")} | {"lost": measured["lost"],
                                                            "duplicated": measured["duplicated"],
                                                            "correct": measured["correct"]}


def run(quick: bool, state_mb: float | None = None, png: str | None = None, only: list[str] | None = None) -> dict:
    """Every strategy (or `only` these), then all_at_once at a large state for handover_growth."""
    console = Console(force_terminal=False, quiet=True)
    steady_s = 20.0 if quick else 40.0
    small = 10.0
    large = state_mb if state_mb is not None else (200.0 if quick else 500.0)
    strategies = [s for s in MEASURED if not only or s in only]
    runs = {strategy: measure(window_bench(_name("bench-rescale", strategy), small), strategy, [4, 2], steady_s,
                              small, console) for strategy in strategies}
    joins = {strategy: measure(join_bench(_name("bench-rescale-join", strategy)), strategy, [4, 2], steady_s, None,
                               console) for strategy in strategies if strategy in JOIN_MEASURED}
    result = {
        "rate_records_per_s": RATE,
        "steady_p99_ms": runs[strategies[0]]["steady_p99_ms"],
        "strategies": {strategy: summary(measured) for strategy, measured in runs.items()},
        "join": {strategy: summary(measured) | {"steady_p99_ms": measured["steady_p99_ms"]}
                 for strategy, measured in joins.items()},
        "runs": runs,
        "join_runs": joins,
    }
    if "all_at_once" in runs:
        grown = measure(window_bench(_name("bench-rescale", "all_at_once"), large), "all_at_once", [4], steady_s,
                        large, console)
        at_small = runs["all_at_once"]["rescales"][0]["handover_ms"]
        at_large = grown["rescales"][0]["handover_ms"]
        result["handover_growth"] = round(at_large / at_small, 3) if at_small else None
        result["handover_growth_states_mb"] = [small, large]
        result["runs"] = {**runs, "all_at_once_large_state": grown}
    from .latency import FLINK_MISSING, flink_peer

    flink = flink_peer()
    if flink is None:
        result["flink"] = FLINK_MISSING
    else:  # Flink's own way to rescale the same state: stop with a savepoint, restart at the new parallelism
        result.update(flink.measure_restart(small, 2, 4))
        for figures in result["strategies"].values():
            if figures["pause_ms"] is not None:
                figures["pause_over_flink_restart"] = round(figures["pause_ms"] / result["flink_restart_pause_ms"], 3)
    if png:
        plot(result["runs"], png)
        result["png"] = png
    return result


def plot(runs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(runs), figsize=(6 * len(runs), 7), squeeze=False, sharey="row")
    for col, (name, measured) in enumerate(runs.items()):
        rows = measured["timeline"]
        t = [row["t_s"] for row in rows]
        for key, marker in (("p50_ms", "."), ("p99_ms", "x"), ("max_ms", "+")):
            # Window results reach the sink once per window: most 100 ms bins hold no sample.
            shown = [(x, row[key]) for x, row in zip(t, rows) if key in row]
            axes[0][col].plot([x for x, _ in shown], [y for _, y in shown], marker, linestyle="none", label=key[:-3])
        out = measured["output_per_100ms"]
        axes[1][col].plot([i * BIN_MS / 1000 for i in range(len(out))], out, label="output records / 100 ms")
        for rescale in measured["rescales"]:
            for ax in (axes[0][col], axes[1][col]):
                ax.axvspan(rescale["start_s"], rescale["end_s"], alpha=0.15)
            if "from" in rescale and "to" in rescale:
                axes[1][col].annotate(f"rescale {rescale['from']}->{rescale['to']}", (rescale["start_s"], 0),
                                      textcoords="offset points", xytext=(2, 4), fontsize="x-small")
        axes[0][col].set_title(f"strategy {name} ({measured['state_mb']:.0f} MB state)")
        axes[0][col].set_yscale("log")
        axes[0][col].set_ylabel("e2e latency (ms)")
        axes[1][col].set_ylabel("records out per 100 ms")
        axes[1][col].set_xlabel("time since the start (s); shaded: a rescale in progress")
        for ax in (axes[0][col], axes[1][col]):
            ax.legend(fontsize="small")
    fig.suptitle("streamjobs bench rescale: latency at the sink and output while the job rescales")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
