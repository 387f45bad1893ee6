"""`streamjobs status`: a running job as a person reads it (a table per operator), or as JSON for scripts."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from streamjobs_core.exchange import RedisExchange
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.plan import JobPlan
from streamjobs_core.reconfigure import ReconfigureController
from streamjobs_core.rescale import progress
from streamjobs_worker.ports import Ports

from .live import LiveView


@dataclass(frozen=True)
class OperatorStatus:
    name: str
    chained_to: str | None
    parallelism: int | None
    epoch: int | None
    in_per_s: float | None  # measured over the status command's second; None when not measured
    lag: float | None
    busy: float | None
    last_rescale: dict | None
    last_decision: dict | None

    def to_json(self) -> dict:
        return {"operator": self.name, "chained_to": self.chained_to, "parallelism": self.parallelism,
                "epoch": self.epoch, "in_per_s": self.in_per_s, "lag": self.lag, "busy": self.busy,
                "last_rescale": self.last_rescale, "last_decision": self.last_decision}


@dataclass(frozen=True)
class JobStatus:
    job: str
    plan_version: int
    operators: list[OperatorStatus]
    rescale_in_progress: dict | None
    rescales_pending: list[dict]
    rescales: list[dict]
    reconfiguration_in_progress: dict | None
    reconfigurations: list[dict]  # changes of the spec (control events are not: they have their own list)
    control_events: list[dict]
    autoscaler_policy: str | None
    decisions: list[dict]
    failure: str | None

    def to_json(self) -> dict:
        return {"job": self.job, "plan_version": self.plan_version, "failed": self.failure,
                "operators": [o.to_json() for o in self.operators], "rescale_in_progress": self.rescale_in_progress,
                "rescales_pending": self.rescales_pending, "rescales": self.rescales,
                "reconfiguration_in_progress": self.reconfiguration_in_progress,
                "reconfigurations": self.reconfigurations, "control_events": self.control_events,
                "autoscaler": {"policy": self.autoscaler_policy, "last_decisions": self.decisions}}


def job_status(store: RedisJobStore, plan: JobPlan, measure_s: float = 1.0) -> JobStatus:
    """What the job's Redis says of it; with `measure_s`, rates, lag and busy shares measured over that long
    from its workers' metrics."""
    rows: dict[str, dict] = {}
    if measure_s:
        view = LiveView(Ports(store, RedisExchange(store.r, store), store.r), plan, {})
        view.rows()
        time.sleep(measure_s)
        rows = {row["operator"]: row for row in view.rows()}
    history = [record.as_dict() for record in store.rescale_history()]
    decisions = store.decisions()
    controls = store.control_history()
    control_versions = {record.version for record in controls}
    reconfiguring = store.reconfigure_state()
    operators = []
    for op in plan.spec.operators:
        head = plan.head(op.name)  # a chained operator runs in its chain head's workers
        assignment = store.assignment(head)
        row = rows.get(op.name)
        operators.append(OperatorStatus(
            op.name, None if head == op.name else head,
            assignment.parallelism if assignment else None, assignment.epoch if assignment else None,
            None if row is None else round(row["in_per_s"], 1), None if row is None else row["lag"],
            None if row is None else row["busy"],
            next((r for r in reversed(history) if r["operator"] == head), None),
            _last_decision(decisions, head)))
    failure = store.failure()
    return JobStatus(
        plan.name, plan.version, operators, progress(store), [vars(request) for request in store.rescale_requests()],
        history, None if reconfiguring is None else {"version": reconfiguring.version,
                                                      "changes": list(reconfiguring.changes),
                                                      "waiting": ReconfigureController(store).waiting(plan)},
        [r.as_dict() for r in store.reconfigure_history() if r.version not in control_versions],
        [record.as_dict() for record in controls[-5:]], plan.spec.autoscaler.policy, decisions[-5:],
        None if failure is None else failure.describe())


def _last_decision(decisions: list[dict], op: str) -> dict | None:
    for entry in reversed(decisions):
        for decision in entry.get("operators") or ([entry] if entry.get("operator") else []):
            if decision.get("operator") == op:
                return {"time": entry.get("time"), "why": decision.get("why") or entry.get("summary", ""),
                        "from": decision.get("current", decision.get("from")),
                        "to": decision.get("parallelism", decision.get("to"))}
    return None


def render(status: JobStatus, console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 160)  # a file or pipe: no folded columns
    if status.failure:
        console.print(escape(f"FAILED: {status.failure}"))
    table = Table(title=f"{status.job} (plan version {status.plan_version})", title_justify="left")
    for column in ("operator", "inst", "epoch", "in rec/s", "lag rec", "busy", "last rescale", "last decision"):
        table.add_column(column, justify="left" if column in ("operator", "last rescale", "last decision") else "right")
    for op in status.operators:
        name = op.name if op.chained_to is None else f"└ {op.name}"
        table.add_row(name, _text(op.parallelism), _text(op.epoch),
                      "" if op.in_per_s is None else f"{op.in_per_s:,.0f}",
                      "" if op.lag is None else f"{op.lag:,.0f}",
                      "chained" if op.chained_to else "" if op.busy is None else f"{op.busy:.0%}",
                      "" if op.chained_to else _rescale(op.last_rescale),
                      "" if op.chained_to or op.last_decision is None else escape(op.last_decision["why"])[:60])
    console.print(table)
    if status.rescale_in_progress:
        r = status.rescale_in_progress
        console.print(f"rescale in progress: {r['operator']} {r['from']} -> {r['to']} ({r['strategy']}), "
                      f"phase {r['phase']}")
    if status.reconfiguration_in_progress:
        console.print(escape(f"reconfiguration in progress to version {status.reconfiguration_in_progress['version']}"
                             f": {'; '.join(status.reconfiguration_in_progress['changes'])}"))
    console.print(f"{len(status.rescales)} rescales, {len(status.reconfigurations)} reconfigurations, "
                  f"{len(status.control_events)} recent control events; autoscaler: {status.autoscaler_policy}. "
                  "--json for everything.")


def _text(value) -> str:
    return "" if value is None else str(value)


def _rescale(record: dict | None) -> str:
    if record is None:
        return ""
    when = record.get("ended_at") or record.get("started_at")
    at = datetime.fromtimestamp(when, UTC).strftime("%H:%M:%S") if isinstance(when, int | float) else ""
    return f"{record['from']} -> {record['to']} {at}, pause {record.get('pause_ms') or 0:,.0f} ms"
