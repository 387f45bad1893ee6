"""The StreamJob's status: what `kubectl get sj` and `kubectl describe sj` show.

Written with direct merge patches of the status subresource, not through kopf's
handler result, because a rescale runs for many seconds and its progress must
be visible while it runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from .kube import Kube
from .resources import Owner

PENDING, DEPLOYING, RUNNING, RESCALING, RECONFIGURING, SUSPENDED, INVALID, FAILED = (
    "Pending", "Deploying", "Running", "Rescaling", "Reconfiguring", "Suspended", "Invalid", "Failed",
)


def operators_status(desired: Mapping[str, int], assigned: Mapping[str, tuple[int, int]],
                     ready: Mapping[str, int]) -> dict:
    """Per operator: desired (spec), current (ready pods), assigned parallelism and assignment epoch."""
    out = {}
    for op, want in desired.items():
        epoch, parallelism = assigned.get(op, (0, 0))
        out[op] = {"desiredParallelism": want, "currentParallelism": ready.get(op, 0),
                   "assignedParallelism": parallelism, "assignmentEpoch": epoch}
    return out


def parallelism_summary(operators: Mapping[str, dict]) -> str:
    """One short column for `kubectl get sj`: `words=1 count=2/3` (current/desired where they differ)."""
    parts = []
    for op, s in operators.items():
        current, desired = s["currentParallelism"], s["desiredParallelism"]
        parts.append(f"{op}={current}" if current == desired else f"{op}={current}/{desired}")
    return " ".join(parts)


def input_rate(previous: tuple[float, int] | None, now: tuple[float, int]) -> float | None:
    """Records per second between two (time, records emitted) readings; None without a usable pair."""
    if previous is None or now[0] <= previous[0] or now[1] < previous[1]:
        return None  # the first reading, or counters that began again (the job was redeployed)
    return round((now[1] - previous[1]) / (now[0] - previous[0]), 1)


class StatusWriter:
    def __init__(self, kube: Kube, owner: Owner) -> None:
        self.kube = kube
        self.owner = owner

    def patch(self, **fields) -> None:
        self.kube.patch("streamjobs", self.owner.namespace, self.owner.name, {"status": fields}, subresource="status")

    def phase(self, phase: str, message: str | None = None, error: str | None = None) -> None:
        # error=None clears a previous error (a merge patch deletes null fields).
        self.patch(phase=phase, message=message, error=error)

    def invalid(self, errors: list[tuple[str, str]]) -> None:
        self.patch(phase=INVALID, error="; ".join(f"{path}: {msg}" for path, msg in errors),
                   errors=[{"field": path, "message": msg} for path, msg in errors])

    def rescale(self, progress: dict | None) -> None:
        self.patch(rescale=progress, rescaleInProgress=progress is not None)

    def operators(self, operators: dict) -> None:
        self.patch(operators=operators, parallelismSummary=parallelism_summary(operators))

    def flow(self, rate: float | None, lag: int) -> None:
        self.patch(inputRate=rate, lag=lag)
