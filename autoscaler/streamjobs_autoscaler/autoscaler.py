"""Execute: the loop that turns metrics into live rescales, one decision per interval.

collect (collect.py) -> evaluate (evaluate.py) -> decide per operator
(policies.py) -> guard rails (guards.py) -> realize through the Scaler port,
remember through the DecisionLog port, report through the Events port. The
clock is injected, so tests drive time and never sleep.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from streamjobs_core.spec import AutoscalerSettings

from . import guards
from .collect import Collector, Snapshot
from .decision import Decision, OperatorDecision, Rule
from .evaluate import Rates, window_rates
from .policies import POLICIES
from .ports import DecisionLog, Events, Scaler
from .topology import Topology

log = logging.getLogger(__name__)


class Autoscaler:
    def __init__(
        self, topology: Topology, settings: AutoscalerSettings, collector: Collector, scaler: Scaler,
        log: DecisionLog, events: Events, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topology = topology
        self.settings = settings
        self.collector = collector
        self.scaler = scaler
        self.log = log
        self.events = events
        self.clock = clock
        self._window: deque[Snapshot] = deque()
        self._last: Snapshot | None = None  # the latest scrape, kept while stabilizing to see changes
        self._next_tick = clock()
        self._stable_after = clock() + settings.stabilization_s  # a fresh job warms up like a rescaled one
        self._down_asked: dict[str, guards.DownAsk | None] = {}
        self._blocked_up: dict[str, str] = {}
        self._up_streak: dict[str, int] = {}
        self._to_judge: dict[str, dict] = {}  # scale-ups whose achieved capacity is checked next time
        self._catching_up: set[str] = set()  # operators scaled beyond their steady need to catch a backlog up
        self._batch_costs: dict[str, float] = {}  # per operator, the fixed cost per batch last fitted
        self._last_holds: tuple = ()

    def follow(self, topology: Topology) -> None:
        """The job's graph as it runs now: a live reconfiguration adds and removes chains. A changed one
        starts the metrics window afresh after stabilization, as any disruption does, and forgets what it
        remembered of the chains gone."""
        if topology == self.topology:
            return
        self.topology = topology
        self._window.clear()
        self._last = None
        self._stable_after = self.clock() + self.settings.stabilization_s
        names = {info.name for info in topology.operators}
        for remembered in (self._down_asked, self._blocked_up, self._up_streak, self._to_judge):
            for name in [n for n in remembered if n not in names]:
                del remembered[name]
        self._catching_up &= names
        self._batch_costs.clear()  # a chain's logic may have changed, and its batches' cost with it

    def tick(self) -> Decision | None:
        """Collect, and when a full window after stabilization is there, decide and execute."""
        now = self.clock()
        if self.settings.policy == "off" or now < self._next_tick:
            return None
        self._next_tick = now + self.settings.interval_s
        try:
            snapshot = self.topology.fold(self.collector.collect(now))
        except (OSError, RuntimeError) as exc:  # metrics unreachable: counters are cumulative, the next scrape resumes
            log.warning("metrics not collected: %s", exc)
            return None
        last, self._last = self._last, snapshot
        disruption = last is not None and _disruption(last, snapshot)
        if disruption:
            log.info("metrics window restarts: %s", disruption)
            # A worker restarted (its counters began again), is missing or came back: like a rescale, the
            # metrics around it describe no steady configuration. Scraping on while stabilizing makes the
            # wait count from the last change, so a restarted worker's warm-up (its JVM's first Spark jobs)
            # stays out of the window however long its restart took.
            self._window.clear()
            self._stable_after = now + self.settings.stabilization_s
            return None
        if now < self._stable_after:
            return None
        self._window.append(snapshot)
        while len(self._window) > 2 and now - self._window[1].time >= self.settings.metrics_window_s:
            self._window.popleft()
        if now - self._window[0].time < self.settings.metrics_window_s:
            return None
        rates = window_rates(self._window, self._batch_costs)
        if not rates:
            return None
        self._batch_costs.update({op: rate.batch_cost_s for op, rate in rates.items() if rate.batch_cost_s})
        self._judge_scale_ups(rates, now)
        return self._decide(rates, now)

    # --- decide ------------------------------------------------------------------

    def _decide(self, rates: dict[str, Rates], now: float) -> Decision | None:
        current = self.scaler.parallelism()
        recommended = POLICIES[self.settings.policy](self.topology, rates, current, self.settings)
        history = self.log.entries()
        decided, asked = [], {}
        for d in recommended:
            op = d.operator
            if op in self._catching_up:
                d = guards.caught_up(d, rates[op], self.settings)
            d = asked[op] = guards.max_step(d, self.settings)
            d, self._up_streak[op] = guards.activation(d, self._up_streak.get(op, 0), self.settings,
                                                       rates[op].settled)
            d = guards.ineffective(d, self._blocked_up.get(op))
            if d.rule != Rule.CATCH_UP_DONE:  # planned when the catch-up was decided: neither delayed nor vetoed
                d = guards.undone_by_history(d, now, history, self.settings)
                d, self._down_asked[op] = guards.scale_down_delay(d, now, self._down_asked.get(op), self.settings)
            decided.append(d)
        if any(d.changes for d in decided):
            # The rescale restarts every operator's metrics window: a scale-up activation still held would wait
            # a whole stabilization more for its last confirmation, and DS2 sizes the operators in one step.
            for i, d in enumerate(decided):
                if d.rule == Rule.ACTIVATION:
                    self._up_streak[d.operator] = 0
                    up = asked[d.operator]
                    up = replace(up, note="; ".join(filter(None, (up.note, "along with the others' rescale"))))
                    decided[i] = guards.ineffective(up, self._blocked_up.get(d.operator))
        decision = Decision(now, self.settings.policy, tuple(decided))
        # A decision that changes nothing is recorded only when what holds changes back differs from last time.
        holds = tuple((d.operator, d.rule, d.parallelism) for d in decided if d.changes or d.rule.event)
        if not decision.changes:
            if holds and holds != self._last_holds:
                self._record(decision)
            self._last_holds = holds
            return decision
        self._last_holds = holds
        return self._execute(decision, rates)

    def _execute(self, decision: Decision, rates: dict[str, Rates]) -> Decision:
        error = None
        for d in decision.changes:
            try:
                self.scaler.rescale(d.operator, d.parallelism)
            except Exception as exc:  # noqa: BLE001 - a failed rescale is reported, the loop goes on
                error = f"rescale of {d.operator} to {d.parallelism} failed: {exc}"
                break
            if d.parallelism > d.current and d.true_rate_per_instance:
                self._to_judge[d.operator] = {"from": d.current, "to": d.parallelism,
                                              "true_rate": d.true_rate_per_instance}
            # Catching up: the policy asked for instances beyond the steady need (not a guard rail keeping more).
            if d.steady_parallelism is not None and d.recommended > d.steady_parallelism < d.parallelism:
                self._catching_up.add(d.operator)
            else:
                self._catching_up.discard(d.operator)
        decision = replace(decision, executed=error is None, error=error)
        self._record(decision)
        # Metrics that include the rescale say nothing about the new configuration.
        self._window.clear()
        self._stable_after = self.clock() + self.settings.stabilization_s
        return decision

    def _record(self, decision: Decision) -> None:
        self.log.append(decision.to_dict())
        for d in decision.operators:
            if d.changes or d.rule.event:
                self.events.emit(_reason(d), d.explain(), warning=d.rule == Rule.INEFFECTIVE)
        if decision.error:
            self.events.emit("RescaleFailed", decision.error, warning=True)

    # --- ineffective scaling (Turbine's untriaged problem) -----------------------

    def _judge_scale_ups(self, rates: dict[str, Rates], now: float) -> None:
        """Capacity (true rate x instances) before a scale-up vs after: if it rose by less than the
        threshold share of what was predicted, more instances do not help this operator."""
        for op, past in list(self._to_judge.items()):
            rate = rates.get(op)
            if rate is None or rate.true_rate_per_instance is None:
                continue
            del self._to_judge[op]
            before = past["from"] * past["true_rate"]
            predicted = past["to"] * past["true_rate"]
            achieved = past["to"] * rate.true_rate_per_instance
            gain = (achieved - before) / (predicted - before)
            self.log.append({"time": now, "operator": op, "from": past["from"], "to": past["to"],
                             "predicted_capacity": predicted, "achieved_capacity": achieved,
                             "gain_share": round(gain, 3), "operators": []})
            if gain < self.settings.ineffective_threshold:
                self._blocked_up[op] = (f"scale-up {past['from']} -> {past['to']} raised capacity by {gain:.0%} of "
                                        f"the predicted {predicted - before:,.0f} rec/s")
                self.events.emit("IneffectiveScaling", f"{op}: {self._blocked_up[op]}; further scale-ups blocked",
                                 warning=True)


def _disruption(before: Snapshot, after: Snapshot) -> str:
    """Why two snapshots do not belong to one steady configuration ("" when they do)."""
    for op, end in after.operators.items():
        start = before.operators.get(op)
        if start is None or start.instances != end.instances:
            return f"{op}: {start.instances if start else 0} -> {end.instances} instances answered"
        if end.records_in < start.records_in or end.busy_s < start.busy_s:
            return f"{op}: counters went back (a worker restarted)"
    missing = set(before.operators) - set(after.operators)
    return f"{', '.join(sorted(missing))}: no instance answered" if missing else ""


def _reason(d: OperatorDecision) -> str:
    if d.changes:
        return "ScaledUp" if d.parallelism > d.current else "ScaledDown"
    return d.rule.event
