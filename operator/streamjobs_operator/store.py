"""The job's state in Redis, as the operator sees it: connect, deploy the plan, clear on deletion."""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from pathlib import Path

from streamjobs_core.connect import Credentials, connect
from streamjobs_core.control import InstanceAddress
from streamjobs_core.exchange import RedisExchange
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import job_id
from streamjobs_core.plan import JobPlan, edge_totals
from streamjobs_core.savepoint import SavepointError, check, read_restore_from, restore
from streamjobs_core.spec import StreamJob

from .config import Settings
from .kube import Kube
from .resources import CA_KEY, PASSWORD_KEY, RedisTarget, with_ca

log = logging.getLogger(__name__)


class NoRedis(LookupError):
    """No Redis to run the job on: the error names the field to set."""


def redis_target(job: StreamJob, settings: Settings) -> RedisTarget:
    redis = job.spec.redis
    url = redis.url or settings.default_redis_url
    if not url:
        raise NoRedis("spec.redis.url: no Redis URL, and the operator has no default (STREAMJOBS_DEFAULT_REDIS_URL)")
    if redis.cluster and "cluster=" not in url:
        url += ("&" if "?" in url else "?") + "cluster=1"
    return RedisTarget(url, redis.password_secret, redis.ca_secret, default=not redis.url)


def open_redis(kube: Kube, namespace: str, target: RedisTarget, settings: Settings):
    """The operator's own connection: credentials in the URL win over spec.redis.passwordSecret's, and those over
    the operator's own password for its default Redis."""
    url = target.url
    if target.ca_secret:
        url = with_ca(url, _ca_file(kube.secret_value(namespace, target.ca_secret, CA_KEY)))
    if target.password_secret:
        password = kube.secret_value(namespace, target.password_secret, PASSWORD_KEY)
    else:
        password = settings.default_redis_password if target.default else None
    return connect(url, Credentials(password=password))


def _ca_file(pem: str) -> str:
    """The CA in a file, as the TLS client wants it; one file per distinct CA (the root fs is read-only)."""
    path = Path(tempfile.gettempdir()) / f"streamjobs-redis-ca-{hashlib.sha256(pem.encode()).hexdigest()[:16]}.crt"
    if not path.exists():
        path.write_text(pem)
    return str(path)


def deploy(r, job: StreamJob, uid: str, settings: Settings, reset: tuple[str, ...] = ()) -> bool:
    """Write the plan and every operator's first assignment, once per StreamJob object.

    Create handlers are retried after a failure; a retry must not wipe a job whose
    workers run already, so the first write records the object's uid and a retry
    that finds it does nothing. Keys of an earlier object of the same namespace
    and name (its finalizer did not run) are cleared first. A spec with `restoreFrom` puts the
    savepoint's keys (state, offsets, plan, assignments) in their place instead; it
    raises SavepointError, naming the field, if it cannot, even with the state of
    the stages in `reset` started afresh, or if the file is not one `settings` trust (savepoint.Trust; a plan in
    it whose SQL reaches the JVM, unless allowed). Returns whether it wrote anything.
    """
    jobs = RedisJobStore(r, job_id(job.metadata.namespace, job.metadata.name))
    if jobs.deployed_by() == uid:
        return False
    if job.spec.restore_from:  # its input streams stay: the savepoint's offsets point into them
        savepoint = read_restore_from(job, settings.savepoint_trust)
        check(savepoint, job, reset)
        refused = [] if settings.allow_jvm_functions else savepoint.jvm_calls()
        if refused:
            raise SavepointError("spec.restoreFrom: the savepoint's {}: {}".format(*refused[0]))
        restore(jobs, savepoint, owner=uid, max_parallelism=job.spec.max_parallelism)
        return True
    jobs.clear(keep_input=False)
    jobs.deploy(JobPlan(job, int(time.time() * 1000)), owner=uid)
    return True


def restamp_t0(r, job: str) -> JobPlan:
    """Fix the sources' event-time origin now, just before they start (as the local runtime does)."""
    return RedisJobStore(r, job).restamp(int(time.time() * 1000))


def read_plan(r, job: str) -> JobPlan | None:
    return RedisJobStore(r, job).plan()


def registered(r, job: str) -> set[str]:
    """`op/instance` of every worker that is ready to process (it registered its metrics endpoint)."""
    return {InstanceAddress(op, i, "").field for op, i in RedisJobStore(r, job).registered()}


def assignments(r, plan: JobPlan) -> dict[str, tuple[int, int]]:
    """Per operator: (assignment epoch, parallelism) as the workers see it; a chained operator has its
    chain head's."""
    out = {}
    for op in plan.vertices:
        assignment = RedisJobStore(r, plan.id).assignment(op)
        if assignment is not None:
            for member in plan.chain(op).operators:
                out[member] = (assignment.epoch, assignment.parallelism)
    return out


def flow(r, plan: JobPlan) -> tuple[int, int]:
    """(records the sources have emitted, records between operators not consumed yet), from the
    exchange's counters: the input rate and lag `kubectl get sj` shows."""
    # Edges between chains go through Redis; those inside a chain hold nothing.
    edges = [edge for op in plan.vertices for edge in plan.edges_out(plan.chain(op).tail)]
    totals = edge_totals(RedisExchange(r, RedisJobStore(r, plan.id)), plan.keys, edges)
    counts = r.hmget(plan.keys.counts, [f"{s.name}:out" for s in plan.spec.sources])
    emitted = sum(int(n or 0) for n in counts)
    return emitted, sum(produced - consumed for produced, consumed in totals)


def clear(r, job: str, uid: str) -> int:
    """Everything of the job, its input streams too, if StreamJob object `uid` deployed it: that object is gone.
    Keys without that ownership record stay: another object's, or nothing this object wrote."""
    jobs = RedisJobStore(r, job)
    owner = jobs.deployed_by()
    if owner != uid:
        log.info("%s: keys left in Redis, deployed by %s, not by the object deleted (%s)", job, owner, uid)
        return 0
    return jobs.clear(keep_input=False)
