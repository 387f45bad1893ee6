"""`streamjobs bench autoscale`: ds2 against the reactive baseline under five load profiles.

Each scenario is a real job on the local runtime: a Zipf source, a window stage
whose per-record cost is simulated by sleeping (so instances add capacity on 2
cores), a Redis sink. The autoscaler rescales live through the rescale
controller. The optimum at a rate is the fewest instances that carry it at the
target utilization with the key groups spread (`balanced`), from an instance's
*measured* capacity: the per-record busy time fitted over every batch of the
run (the sleep plus the worker's own per-record work, ~10 % more than the
nominal cost, which is reported beside it), never less than the sleep itself
(a fit over batches of alike sizes can count part of it as fixed cost). Every
run is verified against the oracle (lost, duplicated).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.console import Console
from streamjobs_autoscaler.collect import EndpointCollector, OperatorCounters
from streamjobs_autoscaler.evaluate import balanced, cost_fit
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
        "trace": trace(1.0 if quick else 2.0),
    }


# A day compressed into minutes (x 240 when quick): night, a morning ramp, a busy day with two short spikes, the
# evening and night again; (from second, records per second).
_DAY = ((0, 0.8 * BASE), (40, 2 * BASE), (80, 5 * BASE), (140, 8 * BASE), (160, 5 * BASE), (200, 8 * BASE),
        (220, 5 * BASE), (260, 2 * BASE), (300, 0.8 * BASE))
_DAY_END_S = 360
# The day's scale-down delay is compressed with it: an hour of the quick day (half an hour of the full one), where
# the other profiles' 60 s would be four hours.
_DAY_SCALE_DOWN_DELAY_S = 15


def trace(stretch: float) -> tuple[dict, float, float]:
    steps = [{"atS": t * stretch, "recordsPerSecond": rate} for t, rate in _DAY[1:]]
    return ({"profile": "steps", "recordsPerSecond": _DAY[0][1], "steps": steps}, _DAY_END_S * stretch,
            _DAY[1][0] * stretch)


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
            "autoscaler": {"policy": policy, **_SETTINGS,
                           **({"scaleDownDelayS": _DAY_SCALE_DOWN_DELAY_S} if name == "trace" else {})},
            # Enough warm spares for a scale-out by three (the trace's 1 -> 4): a decision takes effect without
            # JVM starts on the busy cores. Both policies run with them.
            "rescale": {"spareInstances": 3},
        },
    })


def optimal(rate: float, utilization: float, per_record_s: float = COST_US / 1e6) -> int:
    return balanced(rate * per_record_s / utilization, 120, 1, MAX_INSTANCES)[0]


# The dataflow scenario: a stateless stage and a window after it, each with its own cost and its own optimum,
# under one step of the source's load (the window's input is the stateless stage's output, one for one).
DATAFLOW_COSTS_US = {"parse": COST_US * 0.7, "count": COST_US}
DATAFLOW_STEP = 5 * BASE


def dataflow_job(policy: str) -> StreamJob:
    rate = {"profile": "steps", "recordsPerSecond": BASE, "steps": [{"atS": 40, "recordsPerSecond": DATAFLOW_STEP}]}
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "bench-dataflow"},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "vocabulary": 500, "outOfOrderMs": 200, "rate": rate}],
            "stages": [{"name": "parse", "type": "sql", "inputs": ["words"], "keyBy": "word", "chain": False,
                        "simulatedCostUs": DATAFLOW_COSTS_US["parse"],
                        "query": "SELECT word, event_time FROM input"},
                       {"name": "count", "type": "window_aggregate", "inputs": ["parse"], "keyBy": "word",
                        "simulatedCostUs": DATAFLOW_COSTS_US["count"], "window": {"type": "tumbling", "sizeMs": 2000},
                        "aggregations": [{"function": "count", "as": "n"}]}],
            "sinks": [{"name": "counts", "type": "redis_stream", "inputs": ["count"]}],
            "autoscaler": {"policy": policy, **_SETTINGS},
            "rescale": {"spareInstances": 3},
        },
    })


def sampled_run(job: StreamJob, duration_s: float, timeline: Timeline, console: Console) -> tuple[dict, float, list]:
    """The job's run report, when its timeline started (monotonic) and the autoscaler decisions it executed."""
    try:
        report = run_job(job, duration_s, console=console, during=timeline)
    finally:
        timeline.stop()
    executed = [d for d in report["autoscaler"]["decisions"] if d.get("executed")]
    return report, timeline.started_monotonic or 0.0, executed


def dataflow(policy: str, console: Console, duration_s: float) -> dict:
    """Whether one decision sizes both stages, each at its own optimum from its measured cost."""
    job = dataflow_job(policy)
    curve = RateCurve(job.spec.sources[0].rate)
    utilization = job.spec.autoscaler.target_utilization
    timeline = Timeline(curve, duration_s, tuple(DATAFLOW_COSTS_US))
    report, started, executed = sampled_run(job, duration_s, timeline, console)
    per_record = {op: timeline.per_record_s(op, cost / 1e6) for op, cost in DATAFLOW_COSTS_US.items()}
    decisions = []
    for d in executed:
        t = d["time"] - started
        changed = {o["operator"]: o for o in d["operators"] if o["parallelism"] != o["current"]}
        decisions.append({"t": round(t, 1), "operators": {
            op: {"from": o["current"], "to": o["parallelism"],
                 "optimal": optimal(curve.rate_at(t), utilization, per_record[op]), "why": o["why"]}
            for op, o in changed.items()}})
    final = report["autoscaler"]["final_parallelism"]
    verification = report.get("verification", {})
    return {
        "rescales": len(report["rescales"]),
        "decisions": decisions,
        "operators_sized_by_first_decision": len(decisions[0]["operators"]) if decisions else 0,
        "first_decision_at_optimum": bool(decisions) and all(
            o["to"] == o["optimal"] for o in decisions[0]["operators"].values()),
        "final_parallelism": {op: final[op] for op in DATAFLOW_COSTS_US},
        "optimal_parallelism": {op: optimal(curve.rate_at(duration_s), utilization, per_record[op])
                                for op in DATAFLOW_COSTS_US},
        "measured_us_per_record": {op: round(c * 1e6, 1) for op, c in per_record.items()},
        "lost": verification.get("lost"), "duplicated": verification.get("duplicated"),
        "correct": verification.get("correct"),
        "timeline": timeline.rows,
    }


class Timeline:
    """Samples input rate, throughput, lag and parallelism once a second in its own thread: a
    rescale blocks the runtime's loop (and its `during` hook) for as long as it takes."""

    def __init__(self, curve: RateCurve, until_s: float, operators: tuple[str, ...] = ("count",)) -> None:
        self.curve = curve
        self.until_s = until_s  # the sources stop then; the drain is not part of the timeline
        self.rows: list[dict] = []
        # Per stage, its batch sums over the run, across rescales; the rows' lag and throughput are the last one's.
        self.batches = {op: OperatorCounters() for op in operators}
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

    def per_record_s(self, op: str, nominal_s: float) -> float:
        """A stage's busy seconds per record, fitted over every batch of the run; never less than the sleep
        each record costs (`nominal_s`), which a fit over batches of alike sizes can put partly into the fixed
        cost per batch; the nominal cost where no fit is possible."""
        fit = cost_fit(OperatorCounters(), self.batches[op])
        return max(fit.per_record_s, nominal_s) if fit else nominal_s

    def _add_batches(self, op: str, before: OperatorCounters, after: OperatorCounters) -> None:
        if after.instances != before.instances or after.records_in < before.records_in or after.batches < before.batches:
            return  # a worker restarted or a handover moved counters: this interval says nothing
        sums = self.batches[op]
        for name in ("batches", "records_in", "busy_s", "batch_records_sq", "batch_records_busy", "batch_busy_sq"):
            setattr(sums, name, getattr(sums, name) + getattr(after, name) - getattr(before, name))

    def _sample(self, runtime) -> None:
        collector = EndpointCollector(runtime.jobs)
        previous = None
        while not self._stop.wait(1.0):
            snapshot = collector.collect(time.monotonic())
            if snapshot.time - self.started_monotonic > self.until_s:
                return
            last = list(self.batches)[-1]
            if any(op not in snapshot.operators for op in self.batches):
                continue
            count = snapshot.operators[last]
            row = {"t": snapshot.time - self.started_monotonic,
                   "offered": self.curve.rate_at(time.time() - runtime.plan.t0_ms / 1000),
                   "lag": count.lag, "parallelism": runtime.parallelism[last], "throughput": None,
                   "parallelism_of": {op: runtime.parallelism[op] for op in self.batches}}
            if previous is not None:
                done = count.records_in - previous.operators[last].records_in
                # None across a worker's restart or a handover (counters start again)
                row["throughput"] = done / (snapshot.time - previous.time) if done >= 0 else None
                for op in self.batches:
                    self._add_batches(op, previous.operators[op], snapshot.operators[op])
            previous = snapshot
            self.rows.append(row)


def scenario(name: str, rate: dict, duration_s: float, change_at: float, policy: str, console: Console) -> dict:
    curve = RateCurve(bench_job(name, rate, policy, 1).spec.sources[0].rate)
    utilization = bench_job(name, rate, policy, 1).spec.autoscaler.target_utilization
    start_parallelism = optimal(curve.rate_at(0), utilization)
    job = bench_job(name, rate, policy, start_parallelism)
    timeline = Timeline(curve, duration_s)
    report, started, executed = sampled_run(job, duration_s, timeline, console)
    changes = [(d["time"] - started, o) for d in executed for o in d["operators"]
               if o["operator"] == "count" and o["parallelism"] != o["current"]]
    rows = timeline.rows
    per_record_s = timeline.per_record_s("count", COST_US / 1e6)

    def best(t: float) -> int:
        return optimal(curve.rate_at(t), utilization, per_record_s)

    final_optimum = best(duration_s)
    sustainable_at, decisions_to = None, 0
    for t, o in changes:
        if t >= change_at:
            decisions_to += 1
            if o["parallelism"] >= best(t):
                sustainable_at = t
                break
    if name == "step_down":  # sustainable from the start; what counts is reaching the smaller optimum
        reached = [t for t, o in changes if o["parallelism"] <= final_optimum]
        sustainable_at = reached[0] if reached else None
        decisions_to = len([t for t, _ in changes if sustainable_at is None or t <= sustainable_at])
    violation = sum(b["t"] - a["t"] for a, b in zip(rows, rows[1:]) if b["lag"] > LAG_SLO_S * max(1.0, b["offered"]))
    over, under = provisioning(rows, best)
    verification = report.get("verification", {})
    steps = [step["atS"] for step in rate.get("steps", ())]
    return {
        "decisions_to_sustainable": decisions_to if sustainable_at is not None else None,
        "time_to_sustainable_s": round(sustainable_at - change_at, 1) if sustainable_at is not None else None,
        "rescales": len(report["rescales"]),
        "overshoot": max([max(0, o["parallelism"] - best(t)) for t, o in changes], default=0),
        "lag_slo_violation_s": round(violation, 1),
        "over_provisioning_pct": over,
        "under_provisioning_pct": under,
        "final_parallelism": report["autoscaler"]["final_parallelism"]["count"],
        "optimal_parallelism": final_optimum,
        "optimal_parallelism_nominal": optimal(curve.rate_at(duration_s), utilization),
        "measured_us_per_record": round(per_record_s * 1e6, 1),
        "lost": verification.get("lost"), "duplicated": verification.get("duplicated"),
        "correct": verification.get("correct"),
        "steps": [after_step(t, end, start_parallelism, changes, best)
                  for t, end in zip(steps, [*steps[1:], duration_s])],
        "decisions": [{"t": round(t, 1), "from": o["current"], "to": o["parallelism"], "optimal": best(t),
                       "over": max(0, o["parallelism"] - best(t)), "under": max(0, best(t) - o["parallelism"]),
                       "why": o["why"]}
                      for t, o in changes],
        "timeline": rows,
    }


def provisioning(rows: list[dict], best) -> tuple[float | None, float | None]:
    """Instance-seconds over and under the optimum, in % of the optimum's instance-seconds, over the timeline."""
    spans = [(b["t"] - a["t"], a["parallelism"], best(a["t"])) for a, b in zip(rows, rows[1:])]
    needed = sum(dt * optimum for dt, _, optimum in spans)
    if not needed:
        return None, None
    over = sum(dt * max(0, running - optimum) for dt, running, optimum in spans)
    under = sum(dt * max(0, optimum - running) for dt, running, optimum in spans)
    return round(100 * over / needed, 1), round(100 * under / needed, 1)


def after_step(t: float, end: float, start: int, changes: list[tuple[float, dict]], best) -> dict:
    """A load change at `t` (the next at `end`; `start`, the parallelism the run began with): the decisions
    until the parallelism was at least the optimum, and how long after the change; 0 decisions when it
    already was, None when it never was before the next change."""
    before = [o["parallelism"] for u, o in changes if u < t]
    report = {"at_s": t, "optimal": best(t), "decisions": 0, "sustainable_after_s": 0.0}
    if (before[-1] if before else start) >= best(t):
        return report
    for u, o in changes:
        if t <= u < end:
            report["decisions"] += 1
            if o["parallelism"] >= best(u):
                return {**report, "sustainable_after_s": round(u - t, 1)}
    return {**report, "sustainable_after_s": None}


def run(quick: bool, only: list[str] | None = None, png: str | None = None) -> dict:
    console = Console(force_terminal=False, quiet=True)
    scenarios: dict[str, dict] = {}
    for name, (rate, duration, change_at) in profiles(quick).items():
        if only and name not in only:
            continue
        scenarios[name] = {policy: scenario(name, rate, duration, change_at, policy, console) for policy in POLICIES}
    if not only or "dataflow" in only:
        scenarios["dataflow"] = {policy: dataflow(policy, console, 120.0 if quick else 300.0) for policy in POLICIES}
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
