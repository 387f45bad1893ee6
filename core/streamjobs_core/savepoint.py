"""Savepoints: a job's Redis keys copied at one instant, to go on from later or in another Redis.

Every commit of a worker is one MULTI/EXEC on the job's keys, and those share one hash slot, so a script
that copies them all runs between two commits. The copy holds what the job's Redis would hold had every
process of the job died at that instant: state, changelogs, source offsets, watermarks, plan versions,
what producers wrote into kg streams that consumers had not read yet, and the sinks' outputs. Going on
from it is the recovery the kill -9 tests prove exactly-once: each worker resumes at its last commit.

Left out: the input streams, which producers own (the source offsets in the copy point into them, as a
Flink savepoint holds Kafka offsets, not the topic); which StreamJob resource deployed the job (the one
that restores it does); and requests waiting to be taken (a rescale, a reconfiguration, a control event),
which their callers await from the run they asked.

A rescale or a reconfiguration in progress is refused: its controller lives in the process that runs the
job, not in Redis, and the copy would carry it half done.

A savepoint may go on under another maxParallelism: the restore splits the key groups again (resplit.py).
Taken with `--drain-in-flight` (the sources paused, every record they read processed), it holds no record
between operators, and every key group of an edge has heard the same watermark.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack

from . import keycopy
from .jobstore import ChangeInProgress, RedisJobStore
from .plan import JobPlan
from .reconfigure import Refused, diff
from .resplit import CannotResplit, resplit
from .spec import StreamJob

FORMAT = "streamjobs-savepoint"
VERSION = 1


class SavepointError(RuntimeError):
    """A savepoint that cannot be taken, read or restored; the message says why."""


@dataclass(frozen=True)
class Savepoint:
    job: str
    taken_at_ms: int
    plan: JobPlan  # the latest version at the instant of the copy
    keys: tuple[tuple[str, int, bytes], ...]  # (key without the job's prefix, ttl ms (0: none), DUMP payload)
    redis_version: str

    @property
    def size_bytes(self) -> int:
        return sum(len(payload) for _, _, payload in self.keys)

    def encode(self) -> bytes:
        return msgpack.packb({
            "format": FORMAT, "version": VERSION, "job": self.job, "taken_at_ms": self.taken_at_ms,
            "plan": self.plan.to_json(), "redis_version": self.redis_version,
            "keys": [list(k) for k in self.keys],
        })

    @classmethod
    def decode(cls, data: bytes, source: str = "the savepoint") -> Savepoint:
        try:
            raw = msgpack.unpackb(data)
        except (ValueError, msgpack.UnpackException) as exc:
            raise SavepointError(f"{source} is not a StreamJobs savepoint ({exc})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise SavepointError(f"{source} is not a StreamJobs savepoint")
        if raw.get("version") != VERSION:
            raise SavepointError(f"{source} has format version {raw.get('version')!r}; this release reads {VERSION}")
        return cls(raw["job"], raw["taken_at_ms"], JobPlan.from_json(raw["plan"]),
                   tuple((k, ttl, payload) for k, ttl, payload in raw["keys"]), raw["redis_version"])

    def write(self, path: str | Path) -> None:
        """Whole or not at all: a crash while writing leaves no half savepoint under `path`."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        with open(partial, "wb") as f:
            f.write(self.encode())
            f.flush()
            os.fsync(f.fileno())
        partial.replace(path)

    @classmethod
    def read(cls, path: str | Path) -> Savepoint:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise SavepointError(f"cannot read savepoint {path}: {exc.strerror}") from None
        return cls.decode(data, str(path))


def take(store: RedisJobStore) -> Savepoint:
    try:
        plan, copied = store.copy_keys()
    except ChangeInProgress as exc:
        raise SavepointError(f"a {exc} of '{store.keys.job}' is in progress; take the savepoint once it is done") from None
    if plan is None:
        raise SavepointError(f"no job '{store.keys.job}' in this Redis")
    if store.stop_requested():
        raise SavepointError(f"'{store.keys.job}' was stopped and drained: it ended, and there is nothing to go on from")
    version = store.r.info("server").get("redis_version", "unknown")
    return Savepoint(store.keys.job, int(time.time() * 1000), plan, tuple(copied), str(version))


def read_restore_from(job: StreamJob) -> Savepoint:
    try:
        return Savepoint.read(job.spec.restore_from)
    except SavepointError as exc:
        raise SavepointError(f"spec.restoreFrom: {exc}") from None


def check(savepoint: Savepoint, job: StreamJob, reset: tuple[str, ...] = ()) -> None:
    """Raise if `job` cannot go on from the savepoint: another job, or a change it cannot take (named), even
    with the state of the stages in `reset` started afresh."""
    if savepoint.job != job.metadata.name:
        raise SavepointError(f"metadata.name is '{job.metadata.name}', but the savepoint holds job '{savepoint.job}'")
    changes = diff(savepoint.plan.job, job, reset, restoring=True)
    if changes.refused:
        raise SavepointError(f"the savepoint cannot go on with this spec: {Refused(changes.refused)}")


def restore(store: RedisJobStore, savepoint: Savepoint, owner: str | None = None,
            max_parallelism: int | None = None) -> int:
    """Replace the job's keys (all but its input streams) by the savepoint's at once: a reader sees the job
    before or after, never a mix. Under another `max_parallelism` the key groups are then split again, in one
    transaction (a failure leaves the savepoint's job as it was, and says why). What the savepoint's processes
    said of themselves is forgotten (new ones start) and a stop or pause it was taken at is lifted; `owner`,
    the StreamJob resource that restores it. Returns the keys it replaced."""
    try:
        replaced = store.replace_keys(list(savepoint.keys))
    except keycopy.Unreadable:
        raise SavepointError(f"this Redis cannot read the savepoint's keys, written by Redis "
                             f"{savepoint.redis_version}: restore it into that version or a newer one") from None
    if max_parallelism not in (None, savepoint.plan.spec.max_parallelism):
        try:
            resplit(store, max_parallelism)
        except CannotResplit as exc:
            raise SavepointError(f"spec.maxParallelism: {exc}") from None
    store.forget_processes(savepoint.plan.vertices)
    store.resumed()
    if owner is not None:
        store.adopt(owner)
    return replaced
