"""The operator process: `kopf run -m streamjobs.controller`.

The kopf handlers of streamjobs_operator plus one autoscaler daemon per
StreamJob. The composition lives here, not in the operator package, because
the operator and the autoscaler are kept independent of each other (an
import-linter contract): the operator provides the autoscaler's ports, this
module connects them.
"""

from __future__ import annotations

from typing import Any

import kopf
from streamjobs_autoscaler.autoscaler import Autoscaler
from streamjobs_autoscaler.collect import EndpointCollector, PrometheusCollector
from streamjobs_autoscaler.topology import Topology
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_operator import status
from streamjobs_operator.autoscaling import KopfEvents, SpecScaler, StatusDecisionLog
from streamjobs_operator.handlers import RESOURCE
from streamjobs_operator.reconcile import JobContext, SpecError
from streamjobs_operator.resources import labels

_TICK_S = 1.0


@kopf.daemon(*RESOURCE, initial_delay=2.0, cancellation_timeout=15.0)
def autoscale(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Tick the job's autoscaler while the job runs; its decisions edit the spec (a live rescale)."""
    try:
        ctx = JobContext.of(body, memo.kube, memo.settings)
    except SpecError:
        return  # the create/update handlers report the invalid spec
    settings = ctx.job.spec.autoscaler
    if settings.policy == "off":
        return  # the spec cannot change the policy later: the operator refuses such edits
    with ctx.redis() as r:
        autoscaler: Autoscaler | None = None
        while not stopped:
            if (body.get("status") or {}).get("phase") == status.RUNNING and not body["spec"].get("suspend"):
                autoscaler = autoscaler or _autoscaler(ctx, r, body)
                if autoscaler is not None:
                    autoscaler.follow(Topology.of(RedisJobStore(r, ctx.owner.job).plan()))
                    autoscaler.tick()
            stopped.wait(_TICK_S)


def _autoscaler(ctx: JobContext, r, body: kopf.Body) -> Autoscaler | None:
    jobs = RedisJobStore(r, ctx.owner.job)
    plan = jobs.plan()
    if plan is None:  # not deployed yet
        return None
    settings = ctx.job.spec.autoscaler
    if settings.metrics == "prometheus":
        collector = PrometheusCollector(settings.prometheus_url, ctx.owner.job)
    else:
        collector = EndpointCollector(jobs, hosts=lambda: _pod_ips(ctx))
    return Autoscaler(
        Topology.of(plan), settings, collector, SpecScaler(ctx.kube, ctx.owner, r),
        StatusDecisionLog(ctx.kube, ctx.owner, settings.history_size), KopfEvents(body),
    )


def _pod_ips(ctx: JobContext) -> set[str]:
    """Where the job's workers may be scraped: its own pods, whatever addresses its workers wrote."""
    pods = ctx.kube.list("pods", ctx.owner.namespace, labels(ctx.owner.name))
    return {ip for pod in pods if (ip := (pod.get("status") or {}).get("podIP"))}
