"""kopf wiring only: `kopf run -m streamjobs_operator.handlers` (the logic lives in reconcile.py).

Handlers are sync on purpose: they call the Kubernetes and Redis clients and
the rescale controller, all blocking, and kopf runs sync handlers in its
thread pool, one object at a time.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from typing import Any

import kopf
from streamjobs_core.crd import PLURAL
from streamjobs_core.savepoint import SavepointError
from streamjobs_core.spec import API_GROUP, API_VERSION

from . import reconcile, status
from .config import Settings
from .kube import Kube, KubeError
from .reconcile import Failed, JobContext, NotReady, SpecError, UnsupportedChange
from .resources import Owner
from .store import NoRedis

VERSION = API_VERSION.removeprefix(f"{API_GROUP}/")
RESOURCE = (API_GROUP, VERSION, PLURAL)
FINALIZER = f"{API_GROUP}/redis-keys"
SETTINGS = Settings.from_env()

log = logging.getLogger(__name__)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # Handler progress in annotations: the status belongs to the job's own fields (kubectl get sj).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=API_GROUP)
    settings.posting.level = logging.WARNING  # Events for what users must act on, not every handler run
    # A deleted job's finalizer goes once its timer and daemon stopped. A sync `refresh` caught mid-run does not
    # stop at once, and kopf looks again only after this long (60 s by default): every such deletion waited a
    # minute. A look every second costs a patch of the object's progress annotation.
    settings.background.cancellation_polling = 1.0
    memo.kube = Kube()
    memo.settings = Settings.from_env()  # read at start, not import: tests and restarts see the current env


def _context(body: kopf.Body, memo: kopf.Memo) -> JobContext | None:
    """The job, or None after reporting an invalid spec in the status and as an Event."""
    try:
        return JobContext.of(body, memo.kube, memo.settings)
    except SpecError as exc:
        _invalid(body, memo, exc.errors)
        return None


def _invalid(body: kopf.Body, memo: kopf.Memo, errors: list[tuple[str, str]]) -> None:
    status.StatusWriter(memo.kube, Owner.of(body)).invalid(errors)
    for path, message in errors:
        kopf.warn(body, reason="InvalidSpec", message=f"{path}: {message}")


def _run(body: kopf.Body, memo: kopf.Memo, step) -> str | None:
    """One reconcile step with its failures mapped onto kopf: retry later, or report and stop."""
    ctx = _context(body, memo)
    if ctx is None:
        return None
    rescale = ctx.job.spec.rescale
    if rescale.spare_instances and rescale.strategy not in ("fluid", "batched"):
        kopf.warn(body, reason="Ignored", message=f"spec.rescale.spareInstances: on Kubernetes warm spares serve "
                  f"the fluid and batched strategies; {rescale.strategy} starts new pods")
    try:
        phase = step(ctx)
    except Failed as exc:
        _failed(body, ctx, exc)
        return status.FAILED
    except NotReady as exc:
        ctx.status.phase(status.DEPLOYING, str(exc))
        raise kopf.TemporaryError(str(exc), delay=exc.delay_s) from None
    except (NoRedis, UnsupportedChange, SavepointError) as exc:
        ctx.status.patch(error=str(exc))
        kopf.warn(body, reason="Rejected", message=str(exc))
        return None
    except (LookupError, KubeError) as exc:  # a missing Secret, an API error: may heal
        kopf.warn(body, reason="Failed", message=str(exc))
        raise kopf.TemporaryError(str(exc), delay=10) from None
    ctx.status.phase(phase)
    return phase


@kopf.on.create(*RESOURCE)
def create(body: kopf.Body, memo: kopf.Memo, runtime: datetime.timedelta, **_: Any) -> str | None:
    with _changing(memo):
        return _run(body, memo, lambda ctx: reconcile.create(ctx, body, _reporter(body), runtime.total_seconds()))


def _failed(body: kopf.Body, ctx: JobContext, exc: Failed) -> None:
    ctx.status.phase(status.FAILED, message=str(exc), error=exc.failure.cause)
    kopf.warn(body, reason="JobFailed", message=str(exc))


_WARNINGS = {"SparesNotReady"}  # what reconcile reports that users must act on


def _reporter(body: kopf.Body):
    def report(reason: str, record: dict) -> None:
        # kopf.event, not kopf.info: posting.level (WARNING, against per-handler noise) filters the latter.
        kopf.event(body, type="Warning" if reason in _WARNINGS else "Normal", reason=reason,
                   message=json.dumps(record, sort_keys=True))

    return report


def _changing(memo: kopf.Memo) -> threading.Lock:
    """Held while the job changes (an edit, a control event, a rebalance): timers run beside the change
    handlers, and the controllers take one change of a job at a time."""
    if "changing" not in memo:
        memo["changing"] = threading.Lock()
    return memo["changing"]


@kopf.on.update(*RESOURCE, field="spec")
def update(body: kopf.Body, memo: kopf.Memo, old: Any, new: Any, runtime: datetime.timedelta, **_: Any) -> str | None:
    running = (body.get("status") or {}).get("phase") in (status.RUNNING, status.RESCALING)
    if running and reconcile.parallelism_only(old, new):
        # The rescaler's alone: a redeploy would only find every object in place (seconds of API calls on the
        # way of an autoscaler decision). The rescaler validates the spec as it reads it.
        _rescale_asked(memo).set()
        return None
    with _changing(memo):
        phase = _run(body, memo, lambda ctx: reconcile.update(ctx, body, _reporter(body), runtime.total_seconds()))
    _rescale_asked(memo).set()
    return phase


def _rescale_asked(memo: kopf.Memo) -> threading.Event:
    """Set when the spec changed: the rescaler looks at once instead of at its next round."""
    if "rescale_asked" not in memo:
        memo["rescale_asked"] = threading.Event()
    return memo["rescale_asked"]


@kopf.daemon(*RESOURCE, initial_delay=1.0)
def rescaler(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Carries out the parallelism the spec asks for, from what is persisted: the spec in the resource and the
    assignments (and any unfinished rescale) in Redis. A rescale takes seconds to minutes; run here, the update
    handler that accepted the edit is long done, and an operator that restarts meanwhile picks it up again."""
    asked, next_look = _rescale_asked(memo), 0.0
    while not stopped:
        if not asked.wait(0.5) and time.monotonic() < next_look:
            continue
        asked.clear()
        next_look = time.monotonic() + memo.settings.status_interval_s
        if (body.get("status") or {}).get("phase") not in (status.RUNNING, status.RESCALING) or body["spec"].get("suspend"):
            continue
        with _changing(memo):
            ctx = _context(body, memo)
            try:
                if ctx is not None and reconcile.rescale_pending(ctx):
                    _run(body, memo, lambda ctx: reconcile.rescale(ctx, _reporter(body)))
            except kopf.TemporaryError as exc:  # already reported: look again after its delay
                stopped.wait(exc.delay or memo.settings.status_interval_s)
            except Exception:  # noqa: BLE001 - Redis or the API away, a timeout: the next round resumes from Redis
                log.exception("rescaler of %s", body["metadata"]["name"])


@kopf.on.resume(*RESOURCE)
def resume(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """After an operator restart: a rescale the controller persisted in Redis resumes (or rolls back)."""
    if (body.get("status") or {}).get("phase") in (None, status.INVALID):
        return
    ctx = _context(body, memo)
    if ctx is not None:
        outcome = reconcile.resume_rescale(ctx)
        if outcome is not None:
            kopf.event(body, type="Normal", reason="RescaleResumed", message=json.dumps(outcome))


@kopf.on.delete(*RESOURCE)
def delete(body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
    try:
        deleted = reconcile.cleanup(Owner.of(body), body, memo.kube, memo.settings)
    except Exception as exc:
        if retry < 5:
            raise kopf.TemporaryError(f"cannot clean up yet: {exc}", delay=5) from exc
        # Never block a deletion forever on an unreachable Redis; say what was left behind.
        kopf.warn(body, reason="CleanupFailed", message=f"the job's Redis keys may remain: {exc}")
        return
    log.info("removed %d Redis keys of %s", deleted, body["metadata"]["name"])


@kopf.timer(*RESOURCE, interval=SETTINGS.status_interval_s, initial_delay=1.0)
def refresh(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The status; and what `streamjobs control` and `streamjobs rebalance` asked for through the job's Redis."""
    phase = (body.get("status") or {}).get("phase")
    if phase in (None, status.INVALID, status.DEPLOYING, status.FAILED):
        return
    ctx = _context(body, memo)
    if ctx is None:
        return
    try:
        _, memo["flow"] = reconcile.refresh_status(ctx, memo.get("flow", ()))
    except Failed as exc:
        _failed(body, ctx, exc)
        return
    lock = _changing(memo)
    if phase not in (status.RUNNING, status.RESCALING, status.RECONFIGURING) or not lock.acquire(blocking=False):
        return  # not running, or an edit is being applied: next tick
    try:
        reconcile.handle_requests(ctx, _reporter(body),
                                  lambda message: kopf.warn(body, reason="Rejected", message=message))
    finally:
        lock.release()
