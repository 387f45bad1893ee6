"""The autoscaler's ports on Kubernetes (Scaler, DecisionLog, Events of streamjobs_autoscaler.ports).

Provided structurally: the operator may not import the autoscaler (import-linter keeps the
components independent), so whatever composes the two passes these objects to its Autoscaler.
A decision changes the StreamJob's spec, exactly as a user's `kubectl patch` would: the spec
stays the one source of truth, and the operator's rescaler daemon performs the live rescale.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.spec import StreamJob

from .kube import Kube
from .resources import Owner


def parallelism_patch(job: StreamJob, op: str, parallelism: int) -> list[dict]:
    """A JSON patch setting one operator's parallelism, guarded by a test of the operator's name."""
    for group in ("sources", "stages", "sinks"):
        for index, candidate in enumerate(getattr(job.spec, group)):
            if candidate.name == op:
                path = f"/spec/{group}/{index}"
                # add, not replace: a spec that leaves parallelism to its default has no such member, and a
                # replace of a missing member fails the whole patch (RFC 6902); add sets it either way.
                return [{"op": "test", "path": f"{path}/name", "value": op},
                        {"op": "add", "path": f"{path}/parallelism", "value": parallelism}]
    raise KeyError(op)


class SpecScaler:
    """Scaler: parallelism in force from the assignments; a rescale edits the spec and waits for its record. The
    operators are those of the plan in force, which live reconfigurations change."""

    def __init__(self, kube: Kube, owner: Owner, r, timeout_s: float = 600.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.kube, self.owner, self.r = kube, owner, r
        self.jobs = RedisJobStore(r, owner.job)
        self.timeout_s = timeout_s
        self.sleep = sleep

    def parallelism(self) -> dict[str, int]:
        return {op: self.jobs.assignment(op).parallelism for op in self.jobs.plan().vertices}

    def rescale(self, op: str, parallelism: int) -> None:
        seen = len(self.jobs.rescale_history())
        # The plan's spec lists the operators in the resource's order (the test op guards a stale index).
        self.kube.patch_json("streamjobs", self.owner.namespace, self.owner.name,
                             parallelism_patch(self.jobs.plan().job, op, parallelism))
        deadline = time.monotonic() + self.timeout_s
        while True:
            if any(record.operator == op and record.to_parallelism == parallelism
                   for record in self.jobs.rescale_history(seen)):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the operator did not rescale '{op}' to {parallelism} in {self.timeout_s:.0f} s")
            self.sleep(0.5)


class StatusDecisionLog:
    """DecisionLog: the last `size` decisions in the StreamJob's status (and `lastDecision` for kubectl get)."""

    def __init__(self, kube: Kube, owner: Owner, size: int = 10) -> None:
        self.kube, self.owner, self.size = kube, owner, size

    def entries(self) -> list[dict]:
        body = self.kube.get("streamjobs", self.owner.namespace, self.owner.name) or {}
        return list((body.get("status") or {}).get("decisions") or [])

    def append(self, entry: dict) -> None:
        decisions = [*self.entries(), entry][-self.size:]
        summary = entry.get("summary") or entry.get("reason") or json.dumps(entry, sort_keys=True)[:120]
        self.kube.patch("streamjobs", self.owner.namespace, self.owner.name,
                        {"status": {"decisions": decisions, "lastDecision": summary}}, subresource="status")


class KopfEvents:
    """Events: a Kubernetes Event on the StreamJob per decision (reason + why)."""

    def __init__(self, body, post: Callable[..., None] | None = None) -> None:
        self.body = body
        if post is None:
            import kopf

            post = kopf.event
        self.post = post

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.post(self.body, type="Warning" if warning else "Normal", reason=reason, message=message)
