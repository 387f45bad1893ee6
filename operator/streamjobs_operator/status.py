"""The StreamJob's status: what `kubectl get sj` and `kubectl describe sj` show.

Written with direct merge patches of the status subresource, not through kopf's
handler result, because a rescale runs for many seconds and its progress must
be visible while it runs.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Mapping

from streamjobs_core.control import RescaleRecord

from .kube import Kube
from .resources import Owner

PENDING, DEPLOYING, RUNNING, RESCALING, RECONFIGURING, SUSPENDED, INVALID, FAILED = (
    "Pending", "Deploying", "Running", "Rescaling", "Reconfiguring", "Suspended", "Invalid", "Failed",
)


def operators_status(desired: Mapping[str, int], assigned: Mapping[str, tuple[int, int]],
                     ready: Mapping[str, int], spares: Mapping[str, int] | None = None) -> dict:
    """Per operator: desired (spec), current (ready pods serving as instances), assigned parallelism and
    assignment epoch, and the warm spares ready where it keeps them."""
    out = {}
    for op, want in desired.items():
        epoch, parallelism = assigned.get(op, (0, 0))
        out[op] = {"desiredParallelism": want, "currentParallelism": ready.get(op, 0),
                   "assignedParallelism": parallelism, "assignmentEpoch": epoch}
        if spares and op in spares:
            out[op]["readySpares"] = spares[op]
    return out


def parallelism_summary(operators: Mapping[str, dict]) -> str:
    """One short column for `kubectl get sj`: `words=1 count=2/3` (current/desired where they differ)."""
    parts = []
    for op, s in operators.items():
        current, desired = s["currentParallelism"], s["desiredParallelism"]
        parts.append(f"{op}={current}" if current == desired else f"{op}={current}/{desired}")
    return " ".join(parts)


# The span `kubectl get sj`'s input rate averages over. Sources emit in batches (a chained Spark stage's batch can
# take seconds), so two readings one status interval apart see one batch or none; Flink's meters average too.
RATE_WINDOW_S = 15.0

Reading = tuple[float, int]  # (monotonic time, records the sources have emitted)


def flow_readings(previous: tuple[Reading, ...], now: Reading) -> tuple[Reading, ...]:
    """The readings the input rate averages over: those of the last RATE_WINDOW_S before `now`, then `now`.
    Counters below an earlier reading began again (the job was redeployed): those earlier readings go."""
    if previous and previous[-1][1] > now[1]:
        return (now,)
    return (*(r for r in previous if now[0] - RATE_WINDOW_S <= r[0] < now[0]), now)


def input_rate(readings: tuple[Reading, ...]) -> float | None:
    """Records per second from the first reading to the last; None without two readings."""
    if len(readings) < 2:
        return None
    (t0, n0), (t1, n1) = readings[0], readings[-1]
    return round((n1 - n0) / (t1 - t0), 1)


# Ready: the job processes records (a live rescale or reconfiguration does not stop it). Scaling and
# Reconfiguring: that work is under way. Degraded: the job cannot go on as written until someone acts.
_NOT_READY = {PENDING, DEPLOYING, SUSPENDED, INVALID, FAILED}
_DEGRADED = {INVALID: "InvalidSpec", FAILED: "JobFailed"}


def conditions(previous: list[dict] | None, phase: str, message: str | None, error: str | None,
               now: str) -> list[dict]:
    """The job's conditions in a phase, Kubernetes style (FLIP-493 asks the same of Flink's operator): each
    condition's lastTransitionTime moves only when its status flips."""
    text = message or error or ""
    wanted = [
        ("Ready", phase not in _NOT_READY, phase, text if phase in _NOT_READY else ""),
        ("Scaling", phase == RESCALING, phase if phase == RESCALING else "Steady", text if phase == RESCALING else ""),
        ("Reconfiguring", phase == RECONFIGURING, phase if phase == RECONFIGURING else "Steady",
         text if phase == RECONFIGURING else ""),
        ("Degraded", phase in _DEGRADED, _DEGRADED.get(phase, "AsWritten"), (error or text) if phase in _DEGRADED else ""),
    ]
    before = {c.get("type"): c for c in previous or ()}
    out = []
    for kind, true, reason, detail in wanted:
        value = "True" if true else "False"
        old = before.get(kind)
        since = old["lastTransitionTime"] if old and old.get("status") == value and old.get("lastTransitionTime") \
            else now
        out.append({"type": kind, "status": value, "reason": reason, "message": detail, "lastTransitionTime": since})
    return out


def rescale_history(records: Iterable[RescaleRecord], decisions: list[dict] | None) -> list[dict]:
    """The rescales that ended, oldest first (FLIP-495 asks the same of Flink's autoscaler): when, what, what it
    cost, and why: the autoscaler decision that asked for it (its newest executed one for that operator and
    parallelism), else an edit of the spec."""
    out = []
    for record in records:
        why = next((d["why"] for decision in reversed(decisions or []) if decision.get("executed")
                    for d in decision.get("operators") or () if d.get("operator") == record.operator
                    and d.get("parallelism") == record.to_parallelism and d.get("why")), "spec edit")
        out.append({"endedAt": None if record.ended_at is None else _utc(record.ended_at), "operator": record.operator, "from": record.from_parallelism,
                    "to": record.to_parallelism, "strategy": record.strategy.value, "pauseMs": round(record.pause_ms),
                    "durationS": record.rescale_s, "movedKeyGroups": record.moved_key_groups,
                    "rolledBack": record.rolled_back, "why": why})
    return out


def _utc(seconds: float) -> str:
    """A wall-clock time as Kubernetes writes it (RFC 3339, UTC, whole seconds)."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusWriter:
    def __init__(self, kube: Kube, owner: Owner) -> None:
        self.kube = kube
        self.owner = owner

    def patch(self, **fields) -> None:
        self.kube.patch("streamjobs", self.owner.namespace, self.owner.name, {"status": fields}, subresource="status")

    def phase(self, phase: str, message: str | None = None, error: str | None = None, **fields) -> None:
        # error=None clears a previous error (a merge patch deletes null fields).
        previous = self._current().get("conditions")
        self.patch(phase=phase, message=message, error=error,
                   conditions=conditions(previous, phase, message, error, _utc(time.time())), **fields)

    def invalid(self, errors: list[tuple[str, str]]) -> None:
        self.phase(INVALID, error="; ".join(f"{path}: {msg}" for path, msg in errors),
                   errors=[{"field": path, "message": msg} for path, msg in errors])

    def rescale(self, progress: dict | None) -> None:
        self.patch(rescale=progress, rescaleInProgress=progress is not None)

    def rescales(self, records: list[RescaleRecord]) -> None:
        self.patch(rescales=rescale_history(records, self._current().get("decisions")))

    def _current(self) -> dict:
        """The status as the API server holds it now."""
        return (self.kube.get("streamjobs", self.owner.namespace, self.owner.name) or {}).get("status") or {}

    def operators(self, operators: dict) -> None:
        self.patch(operators=operators, parallelismSummary=parallelism_summary(operators))

    def flow(self, rate: float | None, lag: int) -> None:
        self.patch(inputRate=rate, lag=lag)
