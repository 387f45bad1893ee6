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

A savepoint file may come from anywhere, so it is checked before any key is written: its content against
its SHA-256 digest, its HMAC against the signing key where one is set (`--signing-key-file`, the
operator's STREAMJOBS_SAVEPOINT_SIGNING_KEY), each key's name and Redis type against the job's layout
(layout.saved_kind), and the plan versions, which it carries as plans (parsed and validated like any
spec), not as Redis payloads. A file is read only if it is a regular file within a size bound (and, for
the operator, under its savepoint mount).

A savepoint may go on under another maxParallelism: the restore splits the key groups again (resplit.py).
Taken with `--drain-in-flight` (the sources paused, every record they read processed), it holds no record
between operators, and every key group of an edge has heard the same watermark.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack

from . import keycopy
from .jobstore import ChangeInProgress, RedisJobStore
from .layout import saved_kind
from .plan import JobPlan
from .reconfigure import Refused, diff
from .resplit import CannotResplit, resplit
from .spec import StreamJob
from .sqlguard import refused_calls

MAGIC = b"STREAMJOBS-SAVEPOINT\n"  # before anything is decoded: a device or a file of zeros is refused at once
VERSION = 2
DEFAULT_MAX_BYTES = 8 << 30
# The first byte of a DUMP payload is the value's RDB type: what a key of the layout may hold (layout.saved_kind).
_RDB_TYPES = {"string": {0}, "list": {1, 10, 14, 18}, "set": {2, 11, 20}, "hash": {4, 9, 13, 16, 22, 23, 24, 25},
              "stream": {15, 19, 21}}


class SavepointError(RuntimeError):
    """A savepoint that cannot be taken, read or restored; the message says why."""


@dataclass(frozen=True)
class Trust:
    """What a savepoint read must meet: a regular file of at most `max_bytes` (under `root`, if set), signed with
    `signing_key` (if set; then an unsigned one is refused)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    root: Path | None = None
    signing_key: bytes | None = None


@dataclass(frozen=True)
class Savepoint:
    job: str  # the id of the job it was taken of (layout.job_id)
    taken_at_ms: int
    plan: JobPlan  # the latest version at the instant of the copy
    keys: tuple[tuple[str, int, bytes], ...]  # (key without the job's prefix, ttl ms (0: none), DUMP payload)
    redis_version: str
    earlier: tuple[JobPlan, ...] = ()  # the plan's earlier versions still kept (workers may run them)

    @property
    def size_bytes(self) -> int:
        return sum(len(payload) for _, _, payload in self.keys)

    def encode(self, signing_key: bytes | None = None) -> bytes:
        """The file: MAGIC, then the content with its SHA-256 digest and, given a key, its HMAC."""
        content = msgpack.packb([self.job, self.taken_at_ms, self.plan.to_json(), [p.to_json() for p in self.earlier],
                                 self.redis_version, [list(k) for k in self.keys]])
        digest = hashlib.sha256(content).digest()
        signature = None if signing_key is None else hmac.new(signing_key, digest, hashlib.sha256).digest()
        return MAGIC + msgpack.packb({"version": VERSION, "digest": digest, "signature": signature,
                                      "content": content})

    @classmethod
    def decode(cls, data: bytes, source: str = "the savepoint", signing_key: bytes | None = None) -> Savepoint:
        """Refuses, naming what, a savepoint that is not one, was altered, is not signed with `signing_key`, or
        holds a key or plan the job's layout has no place for; nothing is decoded before the digest matched."""
        if not data.startswith(MAGIC):
            raise SavepointError(f"{source} is not a StreamJobs savepoint")
        try:
            envelope = msgpack.unpackb(data[len(MAGIC):])
        except (ValueError, msgpack.UnpackException) as exc:
            raise SavepointError(f"{source} is cut or damaged ({exc})") from None
        if not isinstance(envelope, dict) or envelope.get("version") != VERSION:
            version = envelope.get("version") if isinstance(envelope, dict) else None
            raise SavepointError(f"{source} has format version {version!r}; this release reads {VERSION}")
        content, digest = envelope.get("content"), envelope.get("digest")
        if not isinstance(content, bytes) or not isinstance(digest, bytes) \
                or not hmac.compare_digest(hashlib.sha256(content).digest(), digest):
            raise SavepointError(f"{source}: its digest does not match its content (altered or damaged)")
        if signing_key is not None:
            signature = envelope.get("signature")
            if not isinstance(signature, bytes):
                raise SavepointError(f"{source} is not signed, and savepoints must be (a signing key is set)")
            if not hmac.compare_digest(hmac.new(signing_key, digest, hashlib.sha256).digest(), signature):
                raise SavepointError(f"{source}: its signature does not match the signing key")
        try:
            job, taken_at_ms, plan, earlier, redis_version, keys = msgpack.unpackb(content)
            savepoint = cls(job, taken_at_ms, JobPlan.from_json(plan),
                            tuple((k, int(ttl), payload) for k, ttl, payload in keys), redis_version,
                            tuple(JobPlan.from_json(p) for p in earlier))
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise SavepointError(f"{source} does not hold a job's plan and keys ({str(exc).splitlines()[0]})") from None
        savepoint.check_keys(source)
        return savepoint

    def check_keys(self, source: str) -> None:
        """Every key one the job's layout has, of the layout's type, for operators its plans have."""
        operators = {op.name for plan in (*self.earlier, self.plan) for op in plan.spec.operators}
        if any(p.version >= self.plan.version for p in self.earlier):
            raise SavepointError(f"{source}: an earlier plan version is not before the latest, {self.plan.version}")
        for name, _, payload in self.keys:
            kind = saved_kind(name, operators) if isinstance(name, str) else None
            if kind is None:
                raise SavepointError(f"{source} holds a key the job's layout has no place for: {name!r}")
            if not isinstance(payload, bytes) or not payload or payload[0] not in _RDB_TYPES[kind]:
                raise SavepointError(f"{source}: key {name!r} should hold a {kind}, and does not")

    def jvm_calls(self) -> list[tuple[str, str]]:
        """(where, message) per SQL field of its plans that reaches the JVM (sqlguard.py): what a restore refuses
        unless such calls are allowed."""
        return [(f"plan version {plan.version}: {field}", message) for plan in (*self.earlier, self.plan)
                for field, message in refused_calls(plan.job)]

    def write(self, path: str | Path, signing_key: bytes | None = None) -> None:
        """Whole or not at all: a crash while writing leaves no half savepoint under `path`."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        with open(partial, "wb") as f:
            f.write(self.encode(signing_key))
            f.flush()
            os.fsync(f.fileno())
        partial.replace(path)

    @classmethod
    def read(cls, path: str | Path, trust: Trust = Trust()) -> Savepoint:
        """The savepoint in `path`, refused quickly, with the reason, unless it is a regular file (not a device,
        a FIFO, or outside `trust.root`) of at most `trust.max_bytes` that starts as a savepoint does."""
        path = Path(path)
        try:
            if trust.root is not None and not path.resolve().is_relative_to(trust.root.resolve()):
                raise SavepointError(f"{path} is not under {trust.root}, where savepoints are read from")
            with open(path, "rb", buffering=0) as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise SavepointError(f"{path} is not a regular file")
                if info.st_size > trust.max_bytes:
                    raise SavepointError(f"{path} is {info.st_size:,} bytes, more than the {trust.max_bytes:,} "
                                         "a savepoint may have here")
                if f.read(len(MAGIC)) != MAGIC:
                    raise SavepointError(f"{path} is not a StreamJobs savepoint")
                data = MAGIC + f.read()
        except OSError as exc:
            raise SavepointError(f"cannot read savepoint {path}: {exc.strerror}") from None
        return cls.decode(data, str(path), trust.signing_key)


def take(store: RedisJobStore) -> Savepoint:
    try:
        plan, earlier, copied = store.copy_keys()
    except ChangeInProgress as exc:
        raise SavepointError(f"a {exc} of '{store.keys.job}' is in progress; take the savepoint once it is done") from None
    if plan is None:
        raise SavepointError(f"no job '{store.keys.job}' in this Redis")
    if store.stop_requested():
        raise SavepointError(f"'{store.keys.job}' was stopped and drained: it ended, and there is nothing to go on from")
    version = store.r.info("server").get("redis_version", "unknown")
    return Savepoint(store.keys.job, int(time.time() * 1000), plan, tuple(copied), str(version), earlier)


def read_restore_from(job: StreamJob, trust: Trust = Trust()) -> Savepoint:
    try:
        return Savepoint.read(job.spec.restore_from, trust)
    except SavepointError as exc:
        raise SavepointError(f"spec.restoreFrom: {exc}") from None


def check(savepoint: Savepoint, job: StreamJob, reset: tuple[str, ...] = ()) -> None:
    """Raise if `job` cannot go on from the savepoint: another job, or a change it cannot take (named), even
    with the state of the stages in `reset` started afresh."""
    # By name: a savepoint may move a job to another namespace (or from the local runtime into one).
    if savepoint.job.rpartition("/")[2] != job.metadata.name:
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
        replaced = store.replace_keys(savepoint.plan, savepoint.earlier, list(savepoint.keys))
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
