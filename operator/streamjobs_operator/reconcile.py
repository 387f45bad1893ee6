"""What the operator does for one StreamJob, free of kopf: deploy, reconfigure, rescale, suspend, clean up.

handlers.py maps kopf's events onto these functions; everything here is
idempotent, because kopf retries a handler that failed or that the operator's
restart interrupted.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from streamjobs_core.control import JobFailure
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import SpecError, parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.reconfigure import OPERATOR_GROUPS, Reconfiguration, ReconfigureController, Refused, diff
from streamjobs_core.rescale import RescaleController, progress
from streamjobs_core.spares import pod_spare
from streamjobs_core.spec import StreamJob

from . import access, admission, resources, status, store
from .config import Settings
from .fleet import KubernetesFleet, epoch_of, ready_instances, spares_of
from .kube import Kube
from .resources import Owner, RedisTarget

# Written on the StreamJob once its Redis is known, so the finalizer can clean
# that Redis even after the spec became invalid.
REDIS_ANNOTATION = "streamjobs.dev/redis"
RESCALES_SHOWN = 10  # the newest rescales in the status; `streamjobs status` reads the whole history
# Set by the user with the edit that needs it (`kubectl annotate` or in the applied YAML): the stateful stages,
# comma-separated, whose state the edit starts afresh (--reset-state). Removed once the edit went through.
RESET_ANNOTATION = "streamjobs.dev/reset-state"


class NotReady(Exception):
    """Come back later (kopf: a temporary error with a delay)."""

    def __init__(self, message: str, delay_s: float = 2.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class UnsupportedChange(ValueError):
    """A change that needs a new job, not a rescale: the message names the fields."""


class Failed(RuntimeError):
    """A worker said the job cannot go on (a query Spark refuses, a function that does not import, an input it
    kept dying at past restarts.maxAttempts); its workers were stopped."""

    def __init__(self, failure: JobFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


def job_of(body: Any) -> StreamJob:
    """The StreamJob model of a custom resource; raises SpecError naming each invalid field."""
    meta = body.get("metadata") or {}
    document = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace") or "default"},
                "spec": body.get("spec")}
    return parse_job(document)


@dataclass
class JobContext:
    owner: Owner
    job: StreamJob
    kube: Kube
    settings: Settings

    @classmethod
    def of(cls, body: Any, kube: Kube, settings: Settings) -> JobContext:
        """Raises SpecError naming each invalid field, and each the operator's configuration refuses
        (admission.py)."""
        job, owner = job_of(body), Owner.of(body)
        refused = admission.refusals(job, owner, settings)
        if refused:
            raise SpecError(refused)
        return cls(owner, job, kube, settings)

    @property
    def target(self) -> RedisTarget:
        return store.redis_target(self.job, self.settings)

    @property
    def status(self) -> status.StatusWriter:
        return status.StatusWriter(self.kube, self.owner)

    @contextmanager
    def redis(self, target: RedisTarget | None = None):
        r = store.open_redis(self.kube, self.owner.namespace, target or self.target, self.settings)
        try:
            yield r
        finally:
            r.close()

    @property
    def access(self) -> resources.JobAccess | None:
        """The job's own Redis user, if the operator gives jobs one (access.py)."""
        return resources.JobAccess.of(self.owner) if self.settings.redis_acl else None

    def build(self, op: str, epoch: int, replicas: int, standby: bool) -> dict:
        return resources.statefulset(self.owner, op, epoch, replicas, standby=standby, redis=self.target,
                                     settings=self.settings, access=self.access,
                                     spares=0 if standby else self.spares(op))

    def spares(self, op: str) -> int:
        """Warm spare pods kept beyond `op`'s instances: for the live rescales that add instances to the
        StatefulSet in place (fluid, batched), when its chain starts Spark. An all_at_once rescale's standbys
        are a StatefulSet of their own, a restart starts every pod anew: neither has spares here."""
        rescale = self.job.spec.rescale
        if rescale.strategy not in ("fluid", "batched") or not JobPlan(self.job, 0).runs_spark(op):
            return 0
        return rescale.spare_instances

    def fleet(self, r=None) -> KubernetesFleet:
        """`r`: the job's Redis, through which a StatefulSet's spares are promoted (without, none are)."""
        return KubernetesFleet(self.kube, self.owner, self.build, timeout_s=self.settings.ready_timeout_s,
                               jobs=None if r is None else RedisJobStore(r, self.owner.job))


def deploy(ctx: JobContext, body: Any, report: Callable[[str, dict], None] = lambda reason, record: None,
           waited_s: float = 0.0) -> str:
    """Plan and assignments in Redis, then the objects; stages and sinks first, sources once those are ready.

    Returns the phase reached; raises NotReady while stages and sinks warm up, and while their warm spares do
    for at most the ready timeout (`waited_s`: how long the handler has been at it): spares serve later
    rescales, and a pod that cannot be scheduled must not keep the job from starting.
    """
    job, owner, kube = ctx.job, ctx.owner, ctx.kube
    target = ctx.target
    annotation = target.annotation()
    if ((body.get("metadata") or {}).get("annotations") or {}).get(REDIS_ANNOTATION) != annotation:
        kube.patch("streamjobs", owner.namespace, owner.name, {"metadata": {"annotations": {REDIS_ANNOTATION: annotation}}})
    with ctx.redis(target) as r:
        store.deploy(r, job, owner.uid, ctx.settings, _annotated_reset(body))
        _grant(ctx, r)
        plan = store.read_plan(r, owner.job)
        kube.ensure("configmaps", resources.configmap(owner, plan.to_json()))
        assigned = store.assignments(r, plan)
        # Sources are the heads of their chains: only chain heads have workers (chaining.py). The plan's, not the
        # edit's: an edit that adds or removes operators is applied after this (reconfigure.py).
        sources = [head for head in plan.vertices if plan.spec.operator(head) in plan.spec.sources]
        fleet = ctx.fleet()
        for op in plan.vertices:
            kube.ensure("services", resources.service(owner, op))
        for op in plan.vertices:
            if op not in sources:
                _ensure_operator(ctx, fleet, op, assigned[op])
        if job.spec.suspend:
            return status.SUSPENDED
        if all(fleet.current(s) is not None for s in sources):
            # Started before: only a resume from suspend to apply (the sources' backpressure waits for the rest).
            for name in sources:
                _ensure_operator(ctx, fleet, name, assigned[name])
            return status.RUNNING
        # Workers register as their chain's head: a chained member has no instances of its own.
        wanted = {f"{op}/{i}" for op in plan.vertices if op not in sources for i in range(assigned[op][1])}
        missing = wanted - store.registered(r, owner.job)
        jobs = RedisJobStore(r, owner.job)
        cold = set()
        for op in plan.vertices:  # warm spares too before any record flows, as the local runtime does
            if op not in sources and (spares := ctx.spares(op)):
                n, ready = assigned[op][1], jobs.ready_spares(op)
                cold |= {f"{op}/{pod_spare(k)}" for k in range(n, n + spares) if pod_spare(k) not in ready}
        _stop_if_failed(jobs, fleet)
        if missing or (cold and waited_s < ctx.settings.ready_timeout_s):
            raise NotReady(f"waiting for {len(missing | cold)} stage and sink workers to warm up: "
                           f"{', '.join(sorted(missing | cold))}")
        if cold:
            report("SparesNotReady", {"spares": sorted(cold), "waitedS": round(waited_s),
                                      "message": "the job starts without them; a scale-out waits for their pods"})
        if not job.spec.restore_from:  # a restored job's event time goes on from its first run's origin
            plan = store.restamp_t0(r, owner.job)
            kube.patch("configmaps", owner.namespace, resources.configmap_name(owner.name),
                       {"data": {"plan.json": plan.to_json()}})
        for name in sources:
            _ensure_operator(ctx, fleet, name, assigned[name])
    return status.RUNNING


def _grant(ctx: JobContext, r) -> None:
    """The job's own Redis user, its workers' (access.py): made again at every deploy (the rules are the user's
    whole definition), with the password of its Secret, which the first deploy creates."""
    job_access = ctx.access
    if job_access is None:
        return
    made = ctx.kube.ensure("secrets", resources.credentials_secret(ctx.owner, job_access, access.new_password()))
    password = base64.b64decode(made["data"][resources.PASSWORD_KEY]).decode()
    access.grant(r, job_access, JobKeys(ctx.owner.job), password, ctx.settings.tables(ctx.owner.namespace))


def _stop_if_failed(jobs: RedisJobStore, fleet: KubernetesFleet) -> None:
    """A job one of whose workers said it cannot go on: every worker stopped (restarts would not help), Failed."""
    failure = jobs.failure()
    if failure is not None:
        fleet.scale_all(lambda op: 0)
        raise Failed(failure)


def _ensure_operator(ctx: JobContext, fleet: KubernetesFleet, op: str, assigned: tuple[int, int]) -> None:
    """Create the operator's StatefulSet if it has none; bring it back from zero replicas after a suspend.

    A StatefulSet newer than the assignment belongs to a rescale in progress,
    which the rescale controller finishes: it is left alone.
    """
    epoch, n = assigned
    replicas = 0 if ctx.job.spec.suspend else n
    current = fleet.current(op)
    if current is None:
        fleet.ensure(ctx.build(op, epoch, replicas, False), replicas)
    elif not ctx.job.spec.suspend and epoch_of(current) <= epoch and not (current.get("spec") or {}).get("replicas"):
        fleet.ensure(current, replicas)


def check_change(deployed: StreamJob, wanted: StreamJob, reset: tuple[str, ...] = ()) -> Reconfiguration:
    """What the edit changes; raises UnsupportedChange naming every field that cannot change on the running
    job (reconfigure.py says which and why), even with the state of the stages in `reset` started afresh."""
    changes = diff(deployed, wanted, reset)
    if changes.refused:
        raise UnsupportedChange(f"{Refused(changes.refused)}. Nothing was applied: revert these, or delete and re-create the StreamJob")
    if changes.live and wanted.spec.suspend:
        raise UnsupportedChange("; ".join(c.describe() for c in changes.live)
                                + ": a suspended job changes live once it runs again; resume it first")
    return changes


def parallelism_only(old: dict | None, new: dict | None) -> bool:
    """Whether a spec edit (as written) changes some operator's parallelism and nothing else: then nothing is
    to deploy or reconfigure, and the rescaler alone has work (an autoscaler decision is such an edit)."""
    def without_parallelism(spec: dict) -> dict:
        return {**spec, **{group: [{k: v for k, v in op.items() if k != "parallelism"} for op in spec.get(group) or ()]
                           for group in OPERATOR_GROUPS}}

    return bool(old) and bool(new) and old != new and without_parallelism(old) == without_parallelism(new)


def create(ctx: JobContext, body: Any, report: Callable[[str, dict], None] = lambda reason, record: None,
           waited_s: float = 0.0) -> str:
    """Deploy; a job restored from a savepoint (`restoreFrom`) runs the savepoint's spec until then, and
    takes what this spec changes as an edit does: live, and rescaled."""
    phase = deploy(ctx, body, report, waited_s)
    if phase != status.RUNNING or not ctx.job.spec.restore_from:
        return phase
    return update(ctx, body, report, waited_s)


def update(ctx: JobContext, body: Any, report: Callable[[str, dict], None] = lambda reason, record: None,
           waited_s: float = 0.0) -> str:
    """A spec edit: refused as a whole if a field cannot change on the running job; else deploy what is
    missing (sources of a job created suspended), then suspend, or change live. A new parallelism is the
    rescaler's to carry out (`rescale`, from the spec and the assignments in Redis), not this handler's."""
    with ctx.redis() as r:
        plan = store.read_plan(r, ctx.owner.job)
    reset = _reset_asked(plan, ctx.job, body)
    changes = check_change(plan.job, ctx.job, reset) if plan is not None else None
    if deploy(ctx, body, report, waited_s) == status.SUSPENDED:
        ctx.fleet().scale_all(lambda op: 0)
        return status.SUSPENDED
    if changes is not None and changes.live:
        reconfigure(ctx, changes, report, reset)
    return status.RUNNING


def _annotated_reset(body: Any) -> tuple[str, ...]:
    raw = ((body.get("metadata") or {}).get("annotations") or {}).get(RESET_ANNOTATION) or ""
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def _reset_asked(plan: JobPlan | None, wanted: StreamJob, body: Any) -> tuple[str, ...]:
    """The stages RESET_ANNOTATION names, when the edit changes something live or refused: the annotation goes
    with the edit that needs it, and a handler retried after that edit went through resets nothing again."""
    reset = _annotated_reset(body)
    if not reset or plan is None:
        return ()
    edit = diff(plan.job, wanted)
    return reset if edit.live or edit.refused else ()


def reconfigure(ctx: JobContext, changes: Reconfiguration,
                report: Callable[[str, dict], None] = lambda reason, record: None, reset: tuple[str, ...] = ()) -> None:
    """The live part of an edit, at a consistent cut (reconfigure.py): an Event per change, then one with what
    it cost; the plan in the ConfigMap follows. The stages in `reset` start their state afresh, and the
    annotation that asked for it goes."""
    for change in changes.live:
        report("ReconfigureStarted", {"field": change.path, "operator": change.operator})
    ctx.status.phase(status.RECONFIGURING, "; ".join(c.describe() for c in changes.live))
    with ctx.redis() as r:
        jobs = RedisJobStore(r, ctx.owner.job)
        _, record = ReconfigureController(jobs, ctx.settings.ready_timeout_s, fleet=ctx.fleet()).apply(
            ctx.job, reset=reset)
        _publish_plan(ctx, jobs.plan())
    if reset:
        ctx.kube.patch("streamjobs", ctx.owner.namespace, ctx.owner.name,
                       {"metadata": {"annotations": {RESET_ANNOTATION: None}}})
    if record is not None:
        ctx.status.patch(lastReconfiguration=record.as_dict())
        report("Reconfigured", record.as_dict())


def _publish_plan(ctx: JobContext, plan: JobPlan) -> None:
    ctx.kube.patch("configmaps", ctx.owner.namespace, resources.configmap_name(ctx.owner.name),
                   {"data": {"plan.json": plan.to_json()}})


def rescale_pending(ctx: JobContext) -> bool:
    """Whether `rescale` has work: a rescale a controller left unfinished, or an operator whose spec asks for
    another parallelism than its assignment has."""
    with ctx.redis() as r:
        plan = store.read_plan(r, ctx.owner.job)
        if plan is None:
            return False
        if RedisJobStore(r, plan.id).rescale_state() is not None:
            return True
        assigned = store.assignments(r, plan)
        return any(ctx.job.spec.operator(op).parallelism != assigned[op][1] for op in plan.vertices if op in assigned)


def rescale(ctx: JobContext, report: Callable[[str, dict], None] = lambda reason, record: None) -> str:
    """Finish any persisted rescale, then rescale each operator whose parallelism differs from its assignment."""
    job = ctx.job
    with ctx.redis() as r:
        plan = store.read_plan(r, ctx.owner.job)
        controller = _controller(r, plan, ctx.fleet(r))
        resumed = controller.resume()
        if resumed is not None:
            report("RescaleResumed", resumed.as_dict())
        for op in plan.vertices:  # a chain rescales as one: its head's parallelism is the chain's
            desired = job.spec.operator(op).parallelism
            epoch, current = store.assignments(r, plan)[op]
            if desired == current:
                continue
            progress = {"operator": op, "from": current, "to": desired, "epoch": epoch + 1,
                        "strategy": job.spec.rescale.strategy}
            report("RescaleStarted", progress)
            ctx.status.phase(status.RESCALING, f"rescaling {op} from {current} to {desired}", rescale=progress,
                             rescaleInProgress=True)
            record = controller.rescale(op, desired, job.spec.rescale.strategy)
            ctx.status.patch(lastRescale=record.as_dict())
            report("Rescaled", record.as_dict())
        ctx.status.rescale(None)
    return status.RUNNING


def resume_rescale(ctx: JobContext) -> dict | None:
    """After an operator restart: finish a live reconfiguration it left, then finish (or roll back) the rescale
    the controller persisted in Redis."""
    with ctx.redis() as r:
        plan = store.read_plan(r, ctx.owner.job)
        if plan is None:
            return None
        jobs = RedisJobStore(r, plan.id)
        if ReconfigureController(jobs, ctx.settings.ready_timeout_s, fleet=ctx.fleet()).resume() is not None:
            plan = jobs.plan()
            _publish_plan(ctx, plan)
        record = _controller(r, plan, ctx.fleet(r)).resume()
        return None if record is None else record.as_dict()


def handle_requests(ctx: JobContext, report: Callable[[str, dict], None] = lambda reason, record: None,
                    reject: Callable[[str], None] = lambda message: None) -> None:
    """What `streamjobs control` and `streamjobs rebalance` left in the job's Redis: control events are
    delivered at a sync point, a rebalance's moves (same parallelism, chosen owners) are made. Parallelism and
    the spec are the resource's to say: a request to change them is rejected (the CLI refuses to send one for
    an operator-owned job; this drops what an older CLI sent)."""
    with ctx.redis() as r:
        plan = store.read_plan(r, ctx.owner.job)
        if plan is None:
            return
        jobs = RedisJobStore(r, plan.id)
        while (event := jobs.next_control_request()) is not None:
            record = ReconfigureController(jobs, ctx.settings.ready_timeout_s).deliver(event)
            if record.version is not None:
                _publish_plan(ctx, jobs.plan())
            report("ControlEvent", record.as_dict())
        while (request := jobs.next_rescale_request()) is not None:
            op = plan.head(request.operator)
            if request.owners is None or request.parallelism != jobs.assignment(op).parallelism:
                reject(f"a rescale of {request.operator} to {request.parallelism} asked through Redis: edit "
                       "the StreamJob's parallelism instead")
                continue
            ctx.status.phase(status.RESCALING, f"rebalancing {op}")
            record = _controller(r, plan, ctx.fleet(r)).rescale(op, request.parallelism, request.strategy,
                                                               request.owners)
            ctx.status.patch(lastRescale=record.as_dict())
            ctx.status.phase(status.RUNNING)
            report("Rebalanced", record.as_dict())
        while (asked := jobs.next_reconfigure_request()) is not None:
            reject(f"a reconfiguration asked through Redis (request {asked.id}): kubectl apply the StreamJob instead")


def _controller(r, plan: JobPlan, fleet: KubernetesFleet) -> RescaleController:
    return RescaleController(RedisJobStore(r, plan.id), plan, fleet, standby_timeout_s=fleet.timeout_s)


def cleanup(owner: Owner, body: Any, kube: Kube, settings: Settings) -> int:
    """Finalizer: stop the workers, then remove every Redis key of the job if this object deployed it; returns
    the keys deleted.

    The StatefulSets go first (the GC would delete them only after this
    finalizer), so no worker recreates a key after the sweep. Keys another
    object deployed (a StreamJob of this namespace and name created since) stay.
    """
    raw = ((body.get("metadata") or {}).get("annotations") or {}).get(REDIS_ANNOTATION)
    if raw is None:
        return 0  # never deployed (e.g. invalid from the start): nothing in Redis
    fleet = KubernetesFleet(kube, owner, lambda *a: {}, timeout_s=settings.ready_timeout_s)
    for sts in fleet.statefulsets():
        kube.delete("statefulsets", owner.namespace, sts["metadata"]["name"])
    fleet.wait_gone(None, lambda pod: True)
    target = RedisTarget.from_annotation(raw)
    r = store.open_redis(kube, owner.namespace, target, settings)
    try:
        deleted = store.clear(r, owner.job, owner.uid)
        if settings.redis_acl:
            access.revoke(r, resources.JobAccess.of(owner))
        return deleted
    finally:
        r.close()


def refresh_status(ctx: JobContext, readings: tuple[status.Reading, ...] = ()) -> tuple[dict, tuple[status.Reading, ...]]:
    """Desired, current and assigned parallelism and epochs, input rate and lag, for `kubectl get sj`.

    Returns the operators' status and the readings of the sources' emitted records (time, count) the next call
    computes the input rate over, `readings` with this one. Raises Failed (its workers stopped) once a worker said
    the job cannot go on.
    """
    fleet = ctx.fleet()
    statefulsets = [(sts["metadata"]["labels"].get(resources.LABEL_OPERATOR), sts) for sts in fleet.statefulsets()]
    kept = {op for op, sts in statefulsets if spares_of(sts)}  # operators whose StatefulSet keeps warm spares
    assigned, in_progress, lag, history, spares = {}, None, None, [], {}
    with ctx.redis() as r:
        plan = store.read_plan(r, ctx.owner.job)
        if plan is not None:
            jobs = RedisJobStore(r, plan.id)
            spares = {op: len(jobs.ready_spares(op)) for op in kept}
            _stop_if_failed(jobs, fleet)
            assigned = store.assignments(r, plan)
            in_progress = progress(jobs)
            history = jobs.rescale_history(-RESCALES_SHOWN)
            emitted, lag = store.flow(r, plan)
            readings = status.flow_readings(readings, (time.monotonic(), emitted))
    ready: dict[str, int] = {}
    for op, sts in statefulsets:
        ready[op] = ready.get(op, 0) + ready_instances(sts, spares.get(op, 0) if spares_of(sts) else 0)
    ctx.status.rescale(in_progress)
    if history:
        ctx.status.rescales(history)
    if lag is not None:
        ctx.status.flow(status.input_rate(readings), lag)
    spec = ctx.job.spec
    names = {op.name for op in spec.operators}
    # While an edit that adds or removes operators is applied, the plan in force and the spec differ: the
    # operators of both, each with its chain's head where the spec has that head too.
    running = names if plan is None else {op.name for op in plan.spec.operators}
    shared = [op.name for op in spec.operators if op.name in running]
    heads = {name: plan.head(name) if plan is not None and plan.head(name) in names else name for name in shared}
    desired = {name: spec.operator(head).parallelism for name, head in heads.items()}
    ready = {name: ready.get(head, 0) for name, head in heads.items()}  # a chained operator runs in its head's pods
    operators = status.operators_status(desired, assigned, ready,
                                        {name: spares[head] for name, head in heads.items() if head in spares})
    ctx.status.operators(operators)
    return operators, readings


__all__ = ["Failed", "JobContext", "NotReady", "SpecError", "UnsupportedChange", "cleanup", "create", "deploy", "handle_requests",
           "job_of", "reconfigure", "refresh_status", "rescale", "resume_rescale", "update"]
