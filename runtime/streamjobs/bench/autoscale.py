"""`streamjobs bench autoscale`: ds2 against the reactive baseline under four load profiles.

Each scenario is a real job on the local runtime: a Zipf source, a window stage
whose per-record cost is simulated by sleeping (so instances add capacity on 2
cores), a Redis sink. The autoscaler rescales live through the rescale
controller. The optimum is computed offline from the known cost:
`ceil(rate x cost / targetUtilization)`, rounded up to a divisor of the key
groups. Every run is verified against the oracle (lost, duplicated).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.console import Console
from streamjobs_autoscaler.collect import EndpointCollector
from streamjobs_autoscaler.evaluate import evenly_spread
from streamjobs_core.loading import parse_job
from streamjobs_core.rates import RateCurve
from streamjobs_core.spec import StreamJob

from ..run import run_job

COST_US = 1000
BASE = 300.0
MAX_INSTANCES = 5  # each instance is a JVM; 5 divides 120 key groups
LAG_SLO_S = 10.0  # the backlog should stay under this many seconds of input
POLICIES = ("ds2", "reactive")
# The scale-down delay outlasts the sine's trough (~30 s under what one instance carries, per 120 s period):
# holding through a trough that comes back is the rail's purpose. Shorter than the default 120 s so that
# step_down's scale-down happens within the quick run.
_SETTINGS = {"intervalS": 2, "metricsWindowS": 10, "stabilizationS": 10, "scaleDownDelayS": 60,
             "catchUpSeconds": 30, "expectedRescaleS": 20, "maxParallelism": MAX_INSTANCES,
             "lagHighRecords": 3000, "lagLowRecords": 300}


def profiles(quick: bool) -> dict[str, tuple[dict, float, float]]:
    """name -> (rate profile, duration s, time of the load change s)."""
    hold = 120.0 if quick else 300.0
    return {
        "step_up": ({"profile": "steps", "recordsPerSecond": BASE,
                     "steps": [{"atS": 40, "recordsPerSecond": 4 * BASE}]}, 40 + hold, 40.0),
        "step_down": ({"profile": "steps", "recordsPerSecond": 4 * BASE,
                       "steps": [{"atS": 40, "recordsPerSecond": BASE}]}, 40 + hold, 40.0),
        "sine": ({"profile": "sine", "recordsPerSecond": 2.5 * BASE, "amplitude": 1.5 * BASE, "periodS": 120},
                 240.0 if quick else 480.0, 0.0),
        "spike": ({"profile": "spike", "recordsPerSecond": BASE, "spikeRecordsPerSecond": 4 * BASE,
                   "spikeAtS": 40, "spikeDurationS": 30}, 40 + hold, 40.0),
    }


def bench_job(name: str, rate: dict, policy: str, parallelism: int) -> StreamJob:
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": f"bench-{name.replace('_', '-')}"},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "vocabulary": 500, "outOfOrderMs": 200, "rate": rate}],
            "stages": [{"name": "count", "type": "window_aggregate", "inputs": ["words"], "keyBy": "word",
                        "parallelism": parallelism, "simulatedCostUs": COST_US,
                        "window": {"type": "tumbling", "sizeMs": 2000},
                        "aggregations": [{"function": "count", "as": "n"}]}],
            "sinks": [{"name": "counts", "type": "redis_stream", "inputs": ["count"]}],
            "autoscaler": {"policy": policy, **_SETTINGS},
            # Enough warm spares for a scale-out by three (1 -> 4, as ds2 decides for step_up): a decision
            # takes effect without JVM starts on the busy cores. Both policies run with them.
            "rescale": {"spareInstances": 3},
        },
    })


def optimal(rate: float, utilization: float) -> int:
    return evenly_spread(rate * COST_US / 1e6 / utilization, 120, 1, MAX_INSTANCES)[0]


class Timeline:
    """Samples input rate, throughput, lag and parallelism once a second in its own thread: a
    rescale blocks the runtime's loop (and its `during` hook) for as long as it takes."""

    def __init__(self, curve: RateCurve, until_s: float) -> None:
        self.curve = curve
        self.until_s = until_s  # the sources stop then; the drain is not part of the timeline
        self.rows: list[dict] = []
        self.started_monotonic: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, runtime, elapsed: float) -> None:
        if self._thread is None:
            self.started_monotonic = time.monotonic() - elapsed
            self._thread = threading.Thread(target=self._sample, args=(runtime,), daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self, runtime) -> None:
        collector = EndpointCollector(runtime.jobs)
        previous = None
        while not self._stop.wait(1.0):
            snapshot = collector.collect(time.monotonic())
            if snapshot.time - self.started_monotonic > self.until_s:
                return
            count = snapshot.operators.get("count")
            if count is None:
                continue
            row = {"t": snapshot.time - self.started_monotonic,
                   "offered": self.curve.rate_at(time.time() - runtime.plan.t0_ms / 1000),
                   "lag": count.lag, "parallelism": runtime.parallelism["count"], "throughput": None}
            if previous is not None and "count" in previous.operators:
                done = count.records_in - previous.operators["count"].records_in
                # None across a worker's restart or a handover (counters start again)
                row["throughput"] = done / (snapshot.time - previous.time) if done >= 0 else None
            previous = snapshot
            self.rows.append(row)


def scenario(name: str, rate: dict, duration_s: float, change_at: float, policy: str, console: Console) -> dict:
    curve = RateCurve(bench_job(name, rate, policy, 1).spec.sources[0].rate)
    utilization = bench_job(name, rate, policy, 1).spec.autoscaler.target_utilization
    start_parallelism = optimal(curve.rate_at(0), utilization)
    job = bench_job(name, rate, policy, start_parallelism)
    timeline = Timeline(curve, duration_s)
    try:
        report = run_job(job, duration_s, console=console, during=timeline)
    finally:
        timeline.stop()
    started = timeline.started_monotonic or 0.0
    executed = [d for d in report["autoscaler"]["decisions"] if d.get("executed")]
    changes = [(d["time"] - started, o) for d in executed for o in d["operators"]
               if o["operator"] == "count" and o["parallelism"] != o["current"]]
    rows = timeline.rows
    final_optimum = optimal(curve.rate_at(duration_s), utilization)
    sustainable_at, decisions_to = None, 0
    for t, o in changes:
        if t >= change_at:
            decisions_to += 1
            if o["parallelism"] >= optimal(curve.rate_at(t), utilization):
                sustainable_at = t
                break
    if name == "step_down":  # sustainable from the start; what counts is reaching the smaller optimum
        reached = [t for t, o in changes if o["parallelism"] <= final_optimum]
        sustainable_at = reached[0] if reached else None
        decisions_to = len([t for t, _ in changes if sustainable_at is None or t <= sustainable_at])
    violation = sum(b["t"] - a["t"] for a, b in zip(rows, rows[1:]) if b["lag"] > LAG_SLO_S * max(1.0, b["offered"]))
    verification = report.get("verification", {})
    return {
        "decisions_to_sustainable": decisions_to if sustainable_at is not None else None,
        "time_to_sustainable_s": round(sustainable_at - change_at, 1) if sustainable_at is not None else None,
        "rescales": len(report["rescales"]),
        "overshoot": max([max(0, o["parallelism"] - optimal(curve.rate_at(t), utilization)) for t, o in changes],
                         default=0),
        "lag_slo_violation_s": round(violation, 1),
        "final_parallelism": report["autoscaler"]["final_parallelism"]["count"],
        "optimal_parallelism": final_optimum,
        "lost": verification.get("lost"), "duplicated": verification.get("duplicated"),
        "correct": verification.get("correct"),
        "decisions": [{"t": round(t, 1), "from": o["current"], "to": o["parallelism"], "why": o["why"]}
                      for t, o in changes],
        "timeline": rows,
    }


def run(quick: bool, only: list[str] | None = None, png: str | None = None) -> dict:
    console = Console(force_terminal=False, quiet=True)
    scenarios: dict[str, dict] = {}
    for name, (rate, duration, change_at) in profiles(quick).items():
        if only and name not in only:
            continue
        scenarios[name] = {policy: scenario(name, rate, duration, change_at, policy, console) for policy in POLICIES}
    result = {"cost_us_per_record": COST_US, "max_instances": MAX_INSTANCES, "lag_slo_s": LAG_SLO_S,
              "scenarios": scenarios}
    if png:
        plot(scenarios, png)
        result["png"] = png
    return result


def plot(scenarios: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(scenarios), figsize=(5 * len(scenarios), 9), squeeze=False, sharex="col")
    for col, (name, by_policy) in enumerate(scenarios.items()):
        for policy, style in zip(POLICIES, ("-", "--")):
            rows = by_policy[policy]["timeline"]
            t = [row["t"] for row in rows]
            if policy == POLICIES[0]:
                axes[0][col].plot(t, [row["offered"] for row in rows], "k:", label="offered")
            axes[0][col].plot(t, [row["throughput"] for row in rows], style, label=f"{policy} throughput")
            axes[1][col].plot(t, [row["lag"] for row in rows], style, label=policy)
            axes[2][col].step(t, [row["parallelism"] for row in rows], style, where="post", label=policy)
            for decision in by_policy[policy]["decisions"]:
                axes[2][col].axvline(decision["t"], linestyle=style, alpha=0.3)
                if "from" in decision and "to" in decision:
                    axes[2][col].annotate(f"{policy}: {decision['from']}->{decision['to']}", (decision["t"], decision["to"]),
                                          textcoords="offset points", xytext=(3, 4), fontsize="x-small")
        axes[0][col].set_title(f"load profile: {name}")
        axes[0][col].set_ylabel("records/s")
        axes[1][col].set_ylabel("lag (records)")
        axes[2][col].set_ylabel("instances (lines: decisions)")
        axes[2][col].set_xlabel("time since the start (s)")
        for row in axes:
            row[col].legend(fontsize="small")
    fig.suptitle("streamjobs bench autoscale: offered load, throughput, lag and instances per policy")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
