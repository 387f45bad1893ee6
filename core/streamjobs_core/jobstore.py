"""The job store: where the control records of control.py live, behind one port.

`JobStore` is what the rescale controller, the handover protocol, the fleets,
the workers and the tools read and write; `RedisJobStore` keeps a job's records
in its Redis slot (layout.py) and `MemoryJobStore` in dictionaries, for unit
tests of the control logic (the way flink-autoscaler tests against its state
store). No other module spells a control key or field.

Writes that belong to a worker's commit (a key group released in the batch that
reached its marker, a source's offsets) take the commit's transaction, anything
with `hset(key, mapping=...)`: the Redis store adds them to it, so they happen
with the batch or not at all; the memory store, which has no transactions,
applies them at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

from . import keycopy
from .codec import encode_marker
from .control import (
    Attempt,
    ControlEvent,
    ControlRecord,
    InstanceAddress,
    JobFailure,
    PartitionProgress,
    Promotion,
    ReconfigureRecord,
    ReconfigureRequest,
    ReconfigureState,
    RescaleRecord,
    RescaleRequest,
    RescaleState,
    StandbyStatus,
    as_text,
)
from .keygroups import Assignment
from .layout import JobKeys
from .plan import JobPlan
from .watermarks import Runs, decode_runs, encode_runs


class Commit(Protocol):
    def hset(self, key: str, mapping: dict) -> None: ...
    def hdel(self, key: str, *fields: str) -> None: ...
    def delete(self, key: str) -> None: ...


class JobStore(Protocol):
    # --- the deployed job ------------------------------------------------------------
    def deploy(self, plan: JobPlan, owner: str | None = None) -> None:
        """The plan and every chain's first assignment; `owner`, the deploying object (a StreamJob's uid)."""
    def plan(self) -> JobPlan | None: ...
    def restamp(self, t0_ms: int) -> JobPlan:
        """Fix the sources' event-time origin: just before they start, so the job does not begin behind."""
    def deployed_by(self) -> str | None: ...
    def clear(self, keep_input: bool = True) -> int:
        """Forget the job: state, progress, outputs and control records; its input streams too unless
        `keep_input` (external producers may have written them before a run started). Returns keys deleted."""

    # --- assignment and per-key-group ownership ---------------------------------
    def assignment(self, op: str) -> Assignment | None: ...
    def upcoming_assignment(self, op: str) -> Assignment | None:
        """The assignment an all_at_once rescale in PRESTAGE will switch to (its standbys prestage it)."""
    def write_assignment(self, op: str, assignment: Assignment, generation: int | None = None) -> None:
        """The assignment in force. Commits are fenced by its generation (default: the epoch): a rescale that
        takes key groups from running instances starts one; a stepwise one, whose instances give them up
        themselves, keeps it."""
    def publish_upcoming(self, op: str, assignment: Assignment) -> None: ...
    def ownership(self, op: str) -> tuple[Assignment | None, dict[int, int]]:
        """The assignment in force and the key groups moved since (kg -> owner now), read at once: the final
        switch replaces the one and drops the other together."""
    def release_in(self, commit: Commit, op: str, releases: dict[int, int]) -> None:
        """Key groups (kg -> new owner) an old owner gives up in this commit."""
    def request_release(self, op: str, releases: dict[int, int]) -> None:
        """Ask owners to give these key groups (kg -> new owner) up at their next commit."""
    def release_requests(self, op: str) -> dict[int, int]: ...
    def mark(self, upstreams: Iterable[str], op: str, targets: dict[int, int]) -> None:
        """Handover markers into the streams of these key groups from each upstream, each naming its key
        group's new owner (kg -> target)."""
    def record_acquired(self, op: str, kgs: Iterable[int], instance: int) -> None: ...
    def acquired(self, op: str) -> dict[int, int]: ...
    def finish_handover(self, op: str, new: Assignment) -> None:
        """`new` in force in the current generation; the handover's records gone, at once."""
    def new_incarnation(self, op: str, instance: int) -> int:
        """A number greater than any earlier one of this instance: a replaced incarnation can no longer commit."""

    # --- what the handover paces itself on ----------------------------------------
    def key_group_lag(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[tuple[str, int], int]:
        """Records produced into and not yet consumed from these key groups' streams, per (upstream, kg)."""
    def committed_watermark(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> int | None:
        """The smallest committed watermark of these key groups' streams; None if one never committed."""
    def consumed(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[int, int]:
        """Records consumed so far from these key groups' streams, summed over the upstreams."""

    # --- the rescale in progress and its history -------------------------------------
    def rescale_state(self) -> RescaleState | None: ...
    def save_rescale(self, state: RescaleState) -> None: ...
    def end_rescale(self, record: RescaleRecord) -> None:
        """Append to the history and clear the rescale in progress, at once."""
    def drop_rescale(self, op: str) -> None:
        """A rolled-back rescale: clear it and what its PRESTAGE published."""
    def clear_prestage(self, op: str) -> None: ...
    def rescale_history(self, start: int = 0) -> list[RescaleRecord]: ...
    def request_rescale(self, request: RescaleRequest) -> None: ...
    def next_rescale_request(self) -> RescaleRequest | None: ...
    def rescale_requests(self) -> list[RescaleRequest]: ...

    # --- live reconfiguration (reconfigure.py) ---------------------------------------------
    def prepare_plan(self, plan: JobPlan, heads: tuple[str, ...]) -> None:
        """`plan`, the next version, readable before it is published, with the first assignment of the chains
        `heads` it adds, their key groups at its version: their workers start on it before anything switches."""
    def withdraw_plan(self, plan: JobPlan, heads: tuple[str, ...]) -> None:
        """A prepared `plan` that will not be published (its chains' workers did not start): it and what was
        written for `heads`."""
    def publish_plan(self, plan: JobPlan, state: ReconfigureState) -> None:
        """`plan` becomes the latest version (the one before kept under its version) and `state` the
        reconfiguration in progress, at once."""
    def plan_version(self, version: int) -> JobPlan | None: ...
    def plans(self) -> list[JobPlan]:
        """Every version of the plan published, oldest first."""
    def record_versions(self, commit: Commit, op: str, kgs: Iterable[int], version: int) -> None:
        """These key groups (source partitions) of `op` switched to `version` in this commit."""
    def versions(self, op: str) -> dict[int, int]:
        """The version each key group of `op` switched to; one never switched is absent (version 0)."""
    def record_cut(self, commit: Commit, op: str, version: int, offsets: dict[int, int | bytes]) -> None:
        """The offsets at which these partitions of source `op` switched to `version`."""
    def cut(self, version: int) -> dict[tuple[str, int], bytes]: ...
    def record_aligned(self, commit: Commit, op: str, instance: int, version: int, ms: float) -> None: ...
    def aligned(self, version: int) -> dict[str, float]: ...
    def record_reset(self, commit: Commit, op: str, version: int, watermarks: dict[int, int]) -> None:
        """Stage `op` dropped its state at its switch to `version`; per key group, the watermark it had then
        (the windows that fired before it)."""
    def resets(self, version: int, op: str) -> dict[int, int]: ...
    def reconfigure_state(self) -> ReconfigureState | None: ...
    def end_reconfigure(self, record: ReconfigureRecord, control: ControlRecord | None = None) -> None:
        """Append to the history (and `control`, a control event's, to its own) and clear the reconfiguration
        in progress, at once."""
    def reconfigure_history(self, start: int = 0) -> list[ReconfigureRecord]: ...
    def request_reconfigure(self, request: ReconfigureRequest) -> None: ...
    def next_reconfigure_request(self) -> ReconfigureRequest | None: ...

    # --- control events (reconfigure.py, controlhandlers.py) -------------------------------
    def record_reply(self, commit: Commit, event: str, op: str, instance: int, reply: str) -> None:
        """An instance's reply (JSON) to control event `event`, with its switch to the event's plan version."""
    def replies(self, event: str) -> dict[str, object]: ...
    def request_control(self, event: ControlEvent) -> None: ...
    def next_control_request(self) -> ControlEvent | None: ...
    def end_control(self, record: ControlRecord) -> None: ...
    def control_history(self, start: int = 0) -> list[ControlRecord]: ...

    # --- standbys and spares ----------------------------------------------------------
    def report_standby(self, op: str, instance: int, epoch: int) -> None: ...
    def report_standby_lag(self, op: str, instance: int, applied: int) -> None: ...
    def standbys(self, op: str) -> list[StandbyStatus]: ...
    def spare_ready(self, op: str, spare: str) -> None: ...
    def ready_spares(self, op: str) -> set[str]: ...
    def promote(self, op: str, spare: str, promotion: Promotion) -> None: ...
    def await_promotion(self, op: str, spare: str, timeout_s: float) -> Promotion | None: ...
    def demote(self, op: str, instance: int, spare: str) -> None: ...
    def demoted_as(self, op: str, instance: int) -> str | None: ...

    # --- instances and the job ------------------------------------------------------------
    def register(self, address: InstanceAddress) -> None: ...
    def unregister(self, op: str, instance: int) -> None: ...
    def registered(self) -> dict[tuple[str, int], str]: ...
    def request_stop(self) -> None: ...
    def stop_requested(self) -> bool: ...
    def request_suspend(self) -> None:
        """Stop at the last commits without draining (`streamjobs stop`): the job goes on later from there."""
    def suspend_requested(self) -> bool: ...
    def request_pause(self, at_ms: int, until_ms: int) -> None:
        """The sources read what is due by `at_ms` (a generator's offsets then meet at one global index) and no
        more, while every other operator goes on: the job drains what is in flight (`savepoint --drain-in-flight`).
        The pause lapses at `until_ms`: a caller that dies does not leave the job paused."""
    def paused_at(self, now_ms: int) -> int | None:
        """The instant of a pause in force at `now_ms`."""
    def resumed(self) -> None:
        """A suspended, paused or failed job runs again."""
    def forget_processes(self, ops: Iterable[str]) -> None:
        """What the processes of an earlier run said of themselves (endpoints, warm spares): a run that goes on
        after they died starts new ones."""
    def attempt(self, op: str, instance: int) -> Attempt | None: ...
    def save_attempt(self, op: str, instance: int, attempt: Attempt | None) -> None:
        """None: the instance stopped cleanly; its next start counts from one."""
    def fail(self, failure: JobFailure) -> None:
        """The job cannot go on (the first failure said stays)."""
    def failure(self) -> JobFailure | None: ...

    # --- committed input progress ----------------------------------------------------------
    def record_partitions(self, commit: Commit, op: str, progress: dict[int, PartitionProgress],
                          watermarks: dict[int, int] | None = None) -> None: ...
    def partitions(self, op: str, partitions: Iterable[int]) -> dict[int, tuple[PartitionProgress | None, int | None]]:
        """Per source partition: what it committed (None: nothing yet) and its watermark."""
    def record_streams(self, commit: Commit, op: str, progress: dict[str, tuple[bytes, Runs]]) -> None:
        """Per input stream: the last entry consumed and its upstream instances' watermarks."""
    def streams(self, op: str, names: list[str]) -> list[tuple[bytes | None, Runs | None]]: ...
    def forget_streams(self, commit: Commit, op: str, names: list[str]) -> None:
        """Input streams `op` reads no more (their producer's tail changed live): them and their progress."""
    def drop_inputs(self, plan: JobPlan, op: str) -> None:
        """Chain head `op` of `plan`, which a later version removed, reads nothing more: its input streams and
        its progress in them go."""


class ChangeInProgress(RuntimeError):
    """A rescale or a reconfiguration is in progress: the message says which."""


class RedisJobStore:
    def __init__(self, r, job: str) -> None:
        self.r = r
        self.keys = JobKeys(job)

    # --- the deployed job -------------------------------------------------------------
    def deploy(self, plan: JobPlan, owner: str | None = None) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.keys.plan, plan.to_json())
        for op in plan.vertices:  # one assignment per chain, its head's (chaining.py)
            self.write_assignment(op, plan.initial_assignment(op), pipe=pipe)
        if owner is not None:
            pipe.set(self.keys.deployed_by, owner)
        pipe.execute()

    def _plan_of(self, raw: bytes | str) -> JobPlan:
        """A plan as this job's: a savepoint's keys restored into another namespace hold their first job's."""
        return JobPlan.from_json(raw).placed(self.keys.job)

    def plan(self) -> JobPlan | None:
        raw = self.r.get(self.keys.plan)
        return self._plan_of(raw) if raw is not None else None

    def restamp(self, t0_ms: int) -> JobPlan:
        plan = replace(self.plan(), t0_ms=t0_ms)
        self.r.set(self.keys.plan, plan.to_json())
        return plan

    def adopt(self, owner: str) -> None:
        """A job restored from a savepoint now belongs to `owner` (a StreamJob's uid)."""
        self.r.set(self.keys.deployed_by, owner)

    def deployed_by(self) -> str | None:
        owner = self.r.get(self.keys.deployed_by)
        return None if owner is None else as_text(owner)

    def copy_keys(self) -> tuple[JobPlan | None, tuple[JobPlan, ...], keycopy.Copied]:
        """Every key of the job at one instant (savepoint.py), keys named without the job's prefix, with the
        plan then (None: no job) and its earlier versions, as plans, not as keys. Left out: the input streams,
        who deployed the job, requests not taken yet. Raises ChangeInProgress while a rescale or a
        reconfiguration is."""
        k = self.keys
        try:
            raw, earlier, copied = keycopy.copy(
                self.r, k.plan, k.plans, [k.rescale_current, k.reconfigure_current], k.pattern, k.input_prefix,
                [k.plan, k.plans, k.deployed_by, k.rescale_requests, k.reconfigure_requests, k.control_requests])
        except keycopy.Busy as exc:
            raise ChangeInProgress("rescale" if exc.key == k.rescale_current else "reconfiguration") from None
        cut = len(k.prefix)
        plans = tuple(sorted(map(self._plan_of, earlier.values()), key=lambda p: p.version))
        return (None if raw is None else self._plan_of(raw)), plans, [(key[cut:], t, p) for key, t, p in copied]

    def replace_keys(self, plan: JobPlan, earlier: tuple[JobPlan, ...], copied: keycopy.Copied) -> int:
        """The job's keys, all but its input streams, replaced at once by `plan`, its `earlier` versions and
        `copied` (as `copy_keys` returns them)."""
        k = self.keys
        versions = {str(p.version).encode(): p.placed(k.job).to_json().encode() for p in earlier}
        return keycopy.replace(self.r, (k.plan, plan.placed(k.job).to_json().encode()), (k.plans, versions),
                               k.pattern, k.input_prefix, [(k.prefix + key, ttl, payload) for key, ttl, payload in copied])

    def clear(self, keep_input: bool = True) -> int:
        deleted, batch = 0, []
        for key in self.r.scan_iter(match=self.keys.pattern, count=1000):
            if keep_input and self.keys.is_input(key):
                continue
            batch.append(key)
            if len(batch) >= 500:
                deleted += self.r.delete(*batch)
                batch = []
        if batch:
            deleted += self.r.delete(*batch)
        return deleted

    # --- assignment and ownership -------------------------------------------------
    def assignment(self, op: str) -> Assignment | None:
        return _assignment(self.r.hgetall(self.keys.assignment(op)))

    def upcoming_assignment(self, op: str) -> Assignment | None:
        return _assignment(self.r.hgetall(self.keys.next_assignment(op)))

    def write_assignment(self, op: str, assignment: Assignment, generation: int | None = None, pipe=None) -> None:
        (pipe or self.r).hset(self.keys.assignment(op), mapping=_assignment_fields(assignment, generation))

    def publish_upcoming(self, op: str, assignment: Assignment) -> None:
        self.r.hset(self.keys.next_assignment(op), mapping=_assignment_fields(assignment, None))

    def ownership(self, op: str) -> tuple[Assignment | None, dict[int, int]]:
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(self.keys.assignment(op))
        pipe.hgetall(self.keys.moved(op))
        assignment, moved = pipe.execute()
        return _assignment(assignment), _int_map(moved)

    def release_in(self, commit: Commit, op: str, releases: dict[int, int]) -> None:
        commit.hset(self.keys.moved(op), mapping=dict(releases))

    def request_release(self, op: str, releases: dict[int, int]) -> None:
        self.r.hset(self.keys.releases(op), mapping=dict(releases))

    def release_requests(self, op: str) -> dict[int, int]:
        return _int_map(self.r.hgetall(self.keys.releases(op)))

    def mark(self, upstreams: Iterable[str], op: str, targets: dict[int, int]) -> None:
        upstreams = list(upstreams)
        pipe = self.r.pipeline(transaction=False)
        for kg, target in targets.items():
            for upstream in upstreams:
                pipe.xadd(self.keys.kg_stream(upstream, op, kg), encode_marker(target))
        pipe.execute()

    def record_acquired(self, op: str, kgs: Iterable[int], instance: int) -> None:
        mapping = {kg: instance for kg in kgs}
        if mapping:
            self.r.hset(self.keys.acquired(op), mapping=mapping)

    def acquired(self, op: str) -> dict[int, int]:
        return _int_map(self.r.hgetall(self.keys.acquired(op)))

    def finish_handover(self, op: str, new: Assignment) -> None:
        generation, epoch = self.r.hmget(self.keys.assignment(op), ["generation", "epoch"])
        pipe = self.r.pipeline(transaction=True)
        self.write_assignment(op, new, int(generation or epoch), pipe=pipe)
        pipe.delete(self.keys.moved(op), self.keys.releases(op), self.keys.acquired(op))
        pipe.execute()

    def new_incarnation(self, op: str, instance: int) -> int:
        return int(self.r.incr(self.keys.incarnation(op, instance)))

    def fencing_keys(self, op: str, instance: int) -> tuple[str, str]:
        """What a commit WATCHes (transaction.py's Checkpoint)."""
        return self.keys.incarnation(op, instance), self.keys.assignment(op)

    def fencing(self, pipe, op: str, instance: int) -> tuple[int | None, bytes | None]:
        """(the instance's incarnation now, its operator's assignment generation), read in a WATCHing pipe."""
        current = pipe.get(self.keys.incarnation(op, instance))
        generation, epoch = pipe.hmget(self.keys.assignment(op), ["generation", "epoch"])
        # Assignments written before generations existed are fenced by their epoch.
        return (None if current is None else int(current)), generation or epoch

    # --- pacing reads -------------------------------------------------------------
    def key_group_lag(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[tuple[str, int], int]:
        upstreams, kgs = list(upstreams), list(kgs)
        if not kgs or not upstreams:
            return {}
        fields = [str(kg) for kg in kgs]
        pipe = self.r.pipeline(transaction=False)
        for upstream in upstreams:
            pipe.hmget(self.keys.produced(upstream, op), fields)
            pipe.hmget(self.keys.consumed(upstream, op), fields)
        counts = pipe.execute()
        return {(upstream, kg): int(p or 0) - int(c or 0)
                for upstream, produced, consumed in zip(upstreams, counts[::2], counts[1::2])
                for kg, p, c in zip(kgs, produced, consumed)}

    def consumed(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[int, int]:
        kgs = list(kgs)
        pipe = self.r.pipeline(transaction=False)
        for upstream in upstreams:
            pipe.hmget(self.keys.consumed(upstream, op), [str(kg) for kg in kgs])
        out = dict.fromkeys(kgs, 0)
        for counts in pipe.execute():
            for kg, n in zip(kgs, counts):
                out[kg] += int(n or 0)
        return out

    def committed_watermark(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> int | None:
        names = [self.keys.kg_stream(upstream, op, kg) for kg in kgs for upstream in upstreams]
        packed = self.r.hmget(self.keys.watermarks(op), names) if names else []
        if not packed or any(p is None for p in packed):
            return None
        return min(mark for p in packed for _, _, mark in decode_runs(p))

    # --- rescales -------------------------------------------------------------------
    def rescale_state(self) -> RescaleState | None:
        raw = self.r.get(self.keys.rescale_current)
        return RescaleState.decode(raw) if raw is not None else None

    def save_rescale(self, state: RescaleState) -> None:
        self.r.set(self.keys.rescale_current, state.encode())

    def end_rescale(self, record: RescaleRecord) -> None:
        pipe = self.r.pipeline()
        pipe.rpush(self.keys.rescale_history, record.encode())
        pipe.delete(self.keys.rescale_current)
        pipe.execute()

    def drop_rescale(self, op: str) -> None:
        self.r.delete(*self._prestage_keys(op), self.keys.rescale_current)

    def clear_prestage(self, op: str) -> None:
        self.r.delete(*self._prestage_keys(op))

    def _prestage_keys(self, op: str) -> tuple[str, ...]:
        return self.keys.standby(op), self.keys.standby_lag(op), self.keys.next_assignment(op)

    def rescale_history(self, start: int = 0) -> list[RescaleRecord]:
        return [RescaleRecord.decode(x) for x in self.r.lrange(self.keys.rescale_history, start, -1)]

    def request_rescale(self, request: RescaleRequest) -> None:
        self.r.rpush(self.keys.rescale_requests, request.encode())

    def next_rescale_request(self) -> RescaleRequest | None:
        raw = self.r.lpop(self.keys.rescale_requests)
        return RescaleRequest.decode(raw) if raw is not None else None

    def rescale_requests(self) -> list[RescaleRequest]:
        return [RescaleRequest.decode(x) for x in self.r.lrange(self.keys.rescale_requests, 0, -1)]

    # --- live reconfiguration ----------------------------------------------------------------
    def prepare_plan(self, plan: JobPlan, heads: tuple[str, ...]) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(self.keys.plans, str(plan.version), plan.to_json())
        for op in heads:
            self.write_assignment(op, plan.initial_assignment(op), pipe=pipe)
            pipe.hset(self.keys.versions(op), mapping={kg: plan.version for kg in range(plan.key_groups(op))})
        pipe.execute()

    def withdraw_plan(self, plan: JobPlan, heads: tuple[str, ...]) -> None:
        self.r.hdel(self.keys.plans, str(plan.version))
        self.r.delete(*(key for op in heads for key in (self.keys.assignment(op), self.keys.versions(op))))

    def publish_plan(self, plan: JobPlan, state: ReconfigureState) -> None:
        before = self.r.get(self.keys.plan)
        pipe = self.r.pipeline(transaction=True)
        if before is not None:
            pipe.hset(self.keys.plans, str(JobPlan.from_json(before).version), before)
        pipe.hdel(self.keys.plans, str(plan.version))  # prepared: it is the latest now
        pipe.set(self.keys.plan, plan.to_json())
        pipe.set(self.keys.reconfigure_current, state.encode())
        pipe.execute()

    def plan_version(self, version: int) -> JobPlan | None:
        latest = self.plan()
        if latest is None or latest.version == version:
            return latest
        raw = self.r.hget(self.keys.plans, str(version))
        return self._plan_of(raw) if raw is not None else None

    def plans(self) -> list[JobPlan]:
        latest = self.plan()
        if latest is None:
            return []
        earlier = [p for p in map(self._plan_of, self.r.hvals(self.keys.plans)) if p.version < latest.version]
        return sorted(earlier, key=lambda p: p.version) + [latest]

    def record_versions(self, commit: Commit, op: str, kgs: Iterable[int], version: int) -> None:
        mapping = {kg: version for kg in kgs}
        if mapping:
            commit.hset(self.keys.versions(op), mapping=mapping)

    def versions(self, op: str) -> dict[int, int]:
        return _int_map(self.r.hgetall(self.keys.versions(op)))

    def record_cut(self, commit: Commit, op: str, version: int, offsets: dict[int, int | bytes]) -> None:
        if offsets:
            commit.hset(self.keys.cut(version), mapping={f"{op}/{p}": o for p, o in offsets.items()})

    def cut(self, version: int) -> dict[tuple[str, int], bytes]:
        out = {}
        for field_, offset in self.r.hgetall(self.keys.cut(version)).items():
            op, _, partition = as_text(field_).rpartition("/")
            out[(op, int(partition))] = offset
        return out

    def record_aligned(self, commit: Commit, op: str, instance: int, version: int, ms: float) -> None:
        commit.hset(self.keys.aligned(version), mapping={f"{op}/{instance}": round(ms, 1)})

    def aligned(self, version: int) -> dict[str, float]:
        return {as_text(k): float(v) for k, v in self.r.hgetall(self.keys.aligned(version)).items()}

    def record_reset(self, commit: Commit, op: str, version: int, watermarks: dict[int, int]) -> None:
        if watermarks:
            commit.hset(self.keys.reset(version, op), mapping={str(kg): wm for kg, wm in watermarks.items()})

    def resets(self, version: int, op: str) -> dict[int, int]:
        return {int(kg): int(wm) for kg, wm in self.r.hgetall(self.keys.reset(version, op)).items()}

    def reconfigure_state(self) -> ReconfigureState | None:
        raw = self.r.get(self.keys.reconfigure_current)
        return ReconfigureState.decode(raw) if raw is not None else None

    def end_reconfigure(self, record: ReconfigureRecord, control: ControlRecord | None = None) -> None:
        pipe = self.r.pipeline()
        pipe.rpush(self.keys.reconfigure_history, record.encode())
        if control is not None:
            pipe.rpush(self.keys.control_history, control.encode())
        pipe.delete(self.keys.reconfigure_current)
        pipe.execute()

    def reconfigure_history(self, start: int = 0) -> list[ReconfigureRecord]:
        return [ReconfigureRecord.decode(x) for x in self.r.lrange(self.keys.reconfigure_history, start, -1)]

    def queue_resplit(self, pipe, previous: JobPlan, plan: JobPlan, assignments: dict[str, Assignment],
                      heard: dict[str, dict[str, Runs]], record: ReconfigureRecord) -> None:
        """Queue on `pipe` what a re-split (resplit.py) writes of the control plane: `plan` in force after
        `previous`, every chain's assignment of the new key groups (what a rescale or a prestage left is
        dropped: none runs), the consumers' streams (from their start, with the watermarks they heard) and the
        record of the version."""
        pipe.hset(self.keys.plans, str(previous.version), previous.to_json())
        pipe.set(self.keys.plan, plan.to_json())
        for op, assignment in assignments.items():
            pipe.delete(self.keys.assignment(op), self.keys.moved(op), self.keys.releases(op), self.keys.acquired(op),
                        *self._prestage_keys(op))
            self.write_assignment(op, assignment, pipe=pipe)
        for op, streams in heard.items():
            pipe.delete(self.keys.offsets(op), self.keys.watermarks(op))
            self.record_streams(pipe, op, {name: (b"0-0", runs) for name, runs in streams.items()})
        pipe.rpush(self.keys.reconfigure_history, record.encode())

    def request_reconfigure(self, request: ReconfigureRequest) -> None:
        self.r.rpush(self.keys.reconfigure_requests, request.encode())

    def next_reconfigure_request(self) -> ReconfigureRequest | None:
        raw = self.r.lpop(self.keys.reconfigure_requests)
        return ReconfigureRequest.decode(raw) if raw is not None else None

    def record_reply(self, commit: Commit, event: str, op: str, instance: int, reply: str) -> None:
        commit.hset(self.keys.replies(event), mapping={f"{op}/{instance}": reply})

    def replies(self, event: str) -> dict[str, object]:
        return {as_text(k): json.loads(v) for k, v in self.r.hgetall(self.keys.replies(event)).items()}

    def request_control(self, event: ControlEvent) -> None:
        self.r.rpush(self.keys.control_requests, event.encode())

    def next_control_request(self) -> ControlEvent | None:
        raw = self.r.lpop(self.keys.control_requests)
        return ControlEvent.decode(raw) if raw is not None else None

    def end_control(self, record: ControlRecord) -> None:
        self.r.rpush(self.keys.control_history, record.encode())

    def control_history(self, start: int = 0) -> list[ControlRecord]:
        return [ControlRecord.decode(x) for x in self.r.lrange(self.keys.control_history, start, -1)]

    # --- standbys and spares --------------------------------------------------------------
    def report_standby(self, op: str, instance: int, epoch: int) -> None:
        self.r.hset(self.keys.standby(op), str(instance), epoch)

    def report_standby_lag(self, op: str, instance: int, applied: int) -> None:
        self.r.hset(self.keys.standby_lag(op), str(instance), applied)

    def standbys(self, op: str) -> list[StandbyStatus]:
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self.keys.standby(op))
        pipe.hgetall(self.keys.standby_lag(op))
        ready, lag = (_int_map(x) for x in pipe.execute())
        return [StandbyStatus(i, ready.get(i), lag.get(i)) for i in sorted({*ready, *lag})]

    def spare_ready(self, op: str, spare: str) -> None:
        self.r.hset(self.keys.spares(op), spare, "ready")

    def ready_spares(self, op: str) -> set[str]:
        return {as_text(s) for s in self.r.hkeys(self.keys.spares(op))}

    def promote(self, op: str, spare: str, promotion: Promotion) -> None:
        pipe = self.r.pipeline()
        pipe.hdel(self.keys.spares(op), spare)
        pipe.rpush(self.keys.promotion(op, spare), promotion.encode())
        pipe.execute()

    def await_promotion(self, op: str, spare: str, timeout_s: float) -> Promotion | None:
        popped = self.r.blpop([self.keys.promotion(op, spare)], timeout=timeout_s)
        return Promotion.decode(popped[1]) if popped is not None else None

    def demote(self, op: str, instance: int, spare: str) -> None:
        self.r.set(self.keys.demotion(op, instance), spare)

    def demoted_as(self, op: str, instance: int) -> str | None:
        name = self.r.getdel(self.keys.demotion(op, instance))
        return None if name is None else as_text(name)

    # --- instances and the job -------------------------------------------------------------
    def register(self, address: InstanceAddress) -> None:
        self.r.hset(self.keys.metrics_endpoints, address.field, address.address)

    def unregister(self, op: str, instance: int) -> None:
        self.r.hdel(self.keys.metrics_endpoints, InstanceAddress(op, instance, "").field)

    def registered(self) -> dict[tuple[str, int], str]:
        found = (InstanceAddress.decode(f, a) for f, a in self.r.hgetall(self.keys.metrics_endpoints).items())
        return {(a.operator, a.instance): a.address for a in found}

    def request_stop(self) -> None:
        self.r.hset(self.keys.control, "stop", "1")

    def stop_requested(self) -> bool:
        return self.r.hget(self.keys.control, "stop") is not None

    def request_suspend(self) -> None:
        self.r.hset(self.keys.control, "suspend", "1")

    def suspend_requested(self) -> bool:
        return self.r.hget(self.keys.control, "suspend") is not None

    def request_pause(self, at_ms: int, until_ms: int) -> None:
        self.r.hset(self.keys.control, "pause", f"{at_ms}:{until_ms}")

    def paused_at(self, now_ms: int) -> int | None:
        raw = self.r.hget(self.keys.control, "pause")
        if raw is None:
            return None
        at, _, until = raw.decode().partition(":")
        return int(at) if now_ms < int(until) else None

    def resumed(self) -> None:
        self.r.hdel(self.keys.control, "suspend", "pause")
        self.r.delete(self.keys.failure)

    def forget_processes(self, ops: Iterable[str]) -> None:
        self.r.delete(self.keys.metrics_endpoints, *(self.keys.spares(op) for op in ops))
        self.r.delete(*(self.keys.attempts(op) for op in ops))

    def attempt(self, op: str, instance: int) -> Attempt | None:
        raw = self.r.hget(self.keys.attempts(op), str(instance))
        return None if raw is None else Attempt.decode(raw)

    def save_attempt(self, op: str, instance: int, attempt: Attempt | None) -> None:
        if attempt is None:
            self.r.hdel(self.keys.attempts(op), str(instance))
        else:
            self.r.hset(self.keys.attempts(op), str(instance), attempt.encode())

    def fail(self, failure: JobFailure) -> None:
        self.r.set(self.keys.failure, failure.encode(), nx=True)

    def failure(self) -> JobFailure | None:
        raw = self.r.get(self.keys.failure)
        return None if raw is None else JobFailure.decode(raw)

    # --- committed input progress ----------------------------------------------------------
    def record_partitions(self, commit: Commit, op: str, progress: dict[int, PartitionProgress],
                          watermarks: dict[int, int] | None = None) -> None:
        fields = {k: v for p, step in progress.items() for k, v in step.fields(p).items()}
        if fields:
            commit.hset(self.keys.offsets(op), mapping=fields)
        if watermarks:
            commit.hset(self.keys.watermarks(op), mapping={_partition(p): m for p, m in watermarks.items()})

    def partitions(self, op: str, partitions: Iterable[int]) -> dict[int, tuple[PartitionProgress | None, int | None]]:
        partitions = list(partitions)
        if not partitions:
            return {}
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(self.keys.offsets(op), [f for p in partitions for f in PartitionProgress.field_names(p)])
        pipe.hmget(self.keys.watermarks(op), [_partition(p) for p in partitions])
        values, marks = pipe.execute()
        width = len(PartitionProgress.field_names(0))
        out = {}
        for i, (p, mark) in enumerate(zip(partitions, marks)):
            fields = values[i * width : (i + 1) * width]
            progress = PartitionProgress.decode(fields) if fields[0] is not None else None
            out[p] = (progress, None if mark is None else int(mark))
        return out

    def record_streams(self, commit: Commit, op: str, progress: dict[str, tuple[bytes, Runs]]) -> None:
        if progress:
            commit.hset(self.keys.offsets(op), mapping={name: cursor for name, (cursor, _) in progress.items()})
            commit.hset(self.keys.watermarks(op),
                        mapping={name: encode_runs(runs) for name, (_, runs) in progress.items()})

    def forget_streams(self, commit: Commit, op: str, names: list[str]) -> None:
        if names:
            commit.hdel(self.keys.offsets(op), *names)
            commit.hdel(self.keys.watermarks(op), *names)
            for name in names:
                commit.delete(name)

    def drop_inputs(self, plan: JobPlan, op: str) -> None:
        pipe = self.r.pipeline(transaction=True)
        for edge in plan.edges_in(op):
            pipe.delete(self.keys.produced(edge.upstream, op), self.keys.consumed(edge.upstream, op),
                        *(self.keys.kg_stream(edge.upstream, op, kg) for kg in range(plan.key_groups(op))))
        pipe.delete(self.keys.offsets(op), self.keys.watermarks(op))
        pipe.execute()

    def streams(self, op: str, names: list[str]) -> list[tuple[bytes | None, Runs | None]]:
        if not names:
            return []
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(self.keys.offsets(op), names)
        pipe.hmget(self.keys.watermarks(op), names)
        cursors, marks = pipe.execute()
        return [(c, None if m is None else decode_runs(m)) for c, m in zip(cursors, marks)]


class MemoryJobStore:
    """The job store in dictionaries: for unit tests of the control logic, one process, no transactions."""

    def __init__(self) -> None:
        self._plan: JobPlan | None = None
        self._owner: str | None = None
        self._assignments: dict[str, tuple[Assignment, int]] = {}
        self._upcoming: dict[str, Assignment] = {}
        self._moved: dict[str, dict[int, int]] = {}
        self._asked: dict[str, dict[int, int]] = {}
        self._acquired: dict[str, dict[int, int]] = {}
        self._incarnations: dict[tuple[str, int], int] = {}
        self.markers: list[tuple[str, str, int, int]] = []  # (upstream, op, kg, target), as placed
        self.lag: dict[tuple[str, str, int], int] = {}  # (upstream, op, kg) -> records: set by a test
        self.watermarks: dict[tuple[str, str, int], int] = {}  # likewise
        self.delivered: dict[tuple[str, str, int], int] = {}  # (upstream, op, kg) -> records consumed: likewise
        self._rescale: RescaleState | None = None
        self._history: list[RescaleRecord] = []
        self._requests: list[RescaleRequest] = []
        self._standbys: dict[str, dict[int, int]] = {}
        self._standby_lag: dict[str, dict[int, int]] = {}
        self._spares: dict[str, set[str]] = {}
        self._promotions: dict[tuple[str, str], list[Promotion]] = {}
        self._demotions: dict[tuple[str, int], str] = {}
        self._registered: dict[tuple[str, int], str] = {}
        self._attempts: dict[tuple[str, int], Attempt] = {}
        self._failure: JobFailure | None = None
        self._stop = False
        self._suspend = False
        self._pause: tuple[int, int] | None = None
        self._partitions: dict[tuple[str, int], tuple[PartitionProgress | None, int | None]] = {}
        self._streams: dict[tuple[str, str], tuple[bytes | None, Runs | None]] = {}
        self._plans: dict[int, JobPlan] = {}
        self._versions: dict[str, dict[int, int]] = {}
        self._cuts: dict[int, dict[tuple[str, int], bytes]] = {}
        self._aligned: dict[int, dict[str, float]] = {}
        self._resets: dict[tuple[int, str], dict[int, int]] = {}
        self._reconfiguring: ReconfigureState | None = None
        self._reconfigured: list[ReconfigureRecord] = []
        self._reconfigure_requests: list[ReconfigureRequest] = []
        self._replies: dict[str, dict[str, object]] = {}
        self._control_requests: list[ControlEvent] = []
        self._controlled: list[ControlRecord] = []

    def deploy(self, plan: JobPlan, owner: str | None = None) -> None:
        self._plan, self._owner = plan, owner
        for op in plan.vertices:
            self.write_assignment(op, plan.initial_assignment(op))

    def plan(self) -> JobPlan | None:
        return self._plan

    def restamp(self, t0_ms: int) -> JobPlan:
        self._plan = replace(self._plan, t0_ms=t0_ms)
        return self._plan

    def deployed_by(self) -> str | None:
        return self._owner

    def clear(self, keep_input: bool = True) -> int:
        """Everything goes: this store holds no input streams."""
        records = len(self._assignments) + len(self._history)
        self.__init__()
        return records

    def assignment(self, op: str) -> Assignment | None:
        return self._assignments[op][0] if op in self._assignments else None

    def generation(self, op: str) -> int | None:
        return self._assignments[op][1] if op in self._assignments else None

    def upcoming_assignment(self, op: str) -> Assignment | None:
        return self._upcoming.get(op)

    def write_assignment(self, op: str, assignment: Assignment, generation: int | None = None) -> None:
        self._assignments[op] = (assignment, assignment.epoch if generation is None else generation)

    def publish_upcoming(self, op: str, assignment: Assignment) -> None:
        self._upcoming[op] = assignment

    def ownership(self, op: str) -> tuple[Assignment | None, dict[int, int]]:
        return self.assignment(op), dict(self._moved.get(op, {}))

    def release_in(self, commit: Commit | None, op: str, releases: dict[int, int]) -> None:
        self._moved.setdefault(op, {}).update(releases)

    def request_release(self, op: str, releases: dict[int, int]) -> None:
        self._asked.setdefault(op, {}).update(releases)

    def release_requests(self, op: str) -> dict[int, int]:
        return dict(self._asked.get(op, {}))

    def mark(self, upstreams: Iterable[str], op: str, targets: dict[int, int]) -> None:
        upstreams = list(upstreams)
        self.markers.extend((upstream, op, kg, target) for kg, target in targets.items() for upstream in upstreams)

    def record_acquired(self, op: str, kgs: Iterable[int], instance: int) -> None:
        self._acquired.setdefault(op, {}).update({kg: instance for kg in kgs})

    def acquired(self, op: str) -> dict[int, int]:
        return dict(self._acquired.get(op, {}))

    def finish_handover(self, op: str, new: Assignment) -> None:
        self.write_assignment(op, new, self.generation(op))
        for records in (self._moved, self._asked, self._acquired):
            records.pop(op, None)

    def new_incarnation(self, op: str, instance: int) -> int:
        self._incarnations[(op, instance)] = self._incarnations.get((op, instance), 0) + 1
        return self._incarnations[(op, instance)]

    def key_group_lag(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[tuple[str, int], int]:
        kgs = list(kgs)
        return {(u, kg): self.lag.get((u, op, kg), 0) for u in upstreams for kg in kgs}

    def consumed(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[int, int]:
        upstreams = list(upstreams)
        return {kg: sum(self.delivered.get((u, op, kg), 0) for u in upstreams) for kg in kgs}

    def committed_watermark(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> int | None:
        marks = [self.watermarks.get((u, op, kg)) for kg in kgs for u in upstreams]
        return None if not marks or None in marks else min(marks)

    def rescale_state(self) -> RescaleState | None:
        return self._rescale

    def save_rescale(self, state: RescaleState) -> None:
        self._rescale = state

    def end_rescale(self, record: RescaleRecord) -> None:
        self._history.append(record)
        self._rescale = None

    def drop_rescale(self, op: str) -> None:
        self.clear_prestage(op)
        self._rescale = None

    def clear_prestage(self, op: str) -> None:
        for records in (self._standbys, self._standby_lag, self._upcoming):
            records.pop(op, None)

    def rescale_history(self, start: int = 0) -> list[RescaleRecord]:
        return self._history[start:]

    def request_rescale(self, request: RescaleRequest) -> None:
        self._requests.append(request)

    def next_rescale_request(self) -> RescaleRequest | None:
        return self._requests.pop(0) if self._requests else None

    def rescale_requests(self) -> list[RescaleRequest]:
        return list(self._requests)

    def prepare_plan(self, plan: JobPlan, heads: tuple[str, ...]) -> None:
        self._plans[plan.version] = plan
        for op in heads:
            self.write_assignment(op, plan.initial_assignment(op))
            self.record_versions(None, op, range(plan.key_groups(op)), plan.version)

    def publish_plan(self, plan: JobPlan, state: ReconfigureState) -> None:
        if self._plan is not None:
            self._plans[self._plan.version] = self._plan
        self._plans.pop(plan.version, None)
        self._plan, self._reconfiguring = plan, state

    def withdraw_plan(self, plan: JobPlan, heads: tuple[str, ...]) -> None:
        self._plans.pop(plan.version, None)
        for op in heads:
            self._assignments.pop(op, None)
            self._versions.pop(op, None)

    def plan_version(self, version: int) -> JobPlan | None:
        return self._plan if self._plan is not None and self._plan.version == version else self._plans.get(version)

    def plans(self) -> list[JobPlan]:
        if self._plan is None:
            return []
        return [self._plans[v] for v in sorted(self._plans) if v < self._plan.version] + [self._plan]

    def record_versions(self, commit: Commit | None, op: str, kgs: Iterable[int], version: int) -> None:
        self._versions.setdefault(op, {}).update({kg: version for kg in kgs})

    def versions(self, op: str) -> dict[int, int]:
        return dict(self._versions.get(op, {}))

    def record_cut(self, commit: Commit | None, op: str, version: int, offsets: dict[int, int | bytes]) -> None:
        self._cuts.setdefault(version, {}).update({(op, p): str(o).encode() if isinstance(o, int) else o
                                                   for p, o in offsets.items()})

    def cut(self, version: int) -> dict[tuple[str, int], bytes]:
        return dict(self._cuts.get(version, {}))

    def record_aligned(self, commit: Commit | None, op: str, instance: int, version: int, ms: float) -> None:
        self._aligned.setdefault(version, {})[f"{op}/{instance}"] = ms

    def aligned(self, version: int) -> dict[str, float]:
        return dict(self._aligned.get(version, {}))

    def record_reset(self, commit: Commit | None, op: str, version: int, watermarks: dict[int, int]) -> None:
        self._resets.setdefault((version, op), {}).update(watermarks)

    def resets(self, version: int, op: str) -> dict[int, int]:
        return dict(self._resets.get((version, op), {}))

    def reconfigure_state(self) -> ReconfigureState | None:
        return self._reconfiguring

    def end_reconfigure(self, record: ReconfigureRecord, control: ControlRecord | None = None) -> None:
        self._reconfigured.append(record)
        if control is not None:
            self._controlled.append(control)
        self._reconfiguring = None

    def reconfigure_history(self, start: int = 0) -> list[ReconfigureRecord]:
        return self._reconfigured[start:]

    def request_reconfigure(self, request: ReconfigureRequest) -> None:
        self._reconfigure_requests.append(request)

    def next_reconfigure_request(self) -> ReconfigureRequest | None:
        return self._reconfigure_requests.pop(0) if self._reconfigure_requests else None

    def record_reply(self, commit: Commit | None, event: str, op: str, instance: int, reply: str) -> None:
        self._replies.setdefault(event, {})[f"{op}/{instance}"] = json.loads(reply)

    def replies(self, event: str) -> dict[str, object]:
        return dict(self._replies.get(event, {}))

    def request_control(self, event: ControlEvent) -> None:
        self._control_requests.append(event)

    def next_control_request(self) -> ControlEvent | None:
        return self._control_requests.pop(0) if self._control_requests else None

    def end_control(self, record: ControlRecord) -> None:
        self._controlled.append(record)

    def control_history(self, start: int = 0) -> list[ControlRecord]:
        return self._controlled[start:]

    def report_standby(self, op: str, instance: int, epoch: int) -> None:
        self._standbys.setdefault(op, {})[instance] = epoch

    def report_standby_lag(self, op: str, instance: int, applied: int) -> None:
        self._standby_lag.setdefault(op, {})[instance] = applied

    def standbys(self, op: str) -> list[StandbyStatus]:
        ready, lag = self._standbys.get(op, {}), self._standby_lag.get(op, {})
        return [StandbyStatus(i, ready.get(i), lag.get(i)) for i in sorted({*ready, *lag})]

    def spare_ready(self, op: str, spare: str) -> None:
        self._spares.setdefault(op, set()).add(spare)

    def ready_spares(self, op: str) -> set[str]:
        return set(self._spares.get(op, set()))

    def promote(self, op: str, spare: str, promotion: Promotion) -> None:
        self._spares.get(op, set()).discard(spare)
        self._promotions.setdefault((op, spare), []).append(promotion)

    def await_promotion(self, op: str, spare: str, timeout_s: float) -> Promotion | None:
        waiting = self._promotions.get((op, spare))
        if waiting:
            return waiting.pop(0)
        time.sleep(timeout_s)
        return None

    def demote(self, op: str, instance: int, spare: str) -> None:
        self._demotions[(op, instance)] = spare

    def demoted_as(self, op: str, instance: int) -> str | None:
        return self._demotions.pop((op, instance), None)

    def register(self, address: InstanceAddress) -> None:
        self._registered[(address.operator, address.instance)] = address.address

    def unregister(self, op: str, instance: int) -> None:
        self._registered.pop((op, instance), None)

    def registered(self) -> dict[tuple[str, int], str]:
        return dict(self._registered)

    def request_stop(self) -> None:
        self._stop = True

    def stop_requested(self) -> bool:
        return self._stop

    def request_suspend(self) -> None:
        self._suspend = True

    def suspend_requested(self) -> bool:
        return self._suspend

    def request_pause(self, at_ms: int, until_ms: int) -> None:
        self._pause = (at_ms, until_ms)

    def paused_at(self, now_ms: int) -> int | None:
        return self._pause[0] if self._pause is not None and now_ms < self._pause[1] else None

    def resumed(self) -> None:
        self._suspend = False
        self._pause = None

    def forget_processes(self, ops: Iterable[str]) -> None:
        self._registered.clear()
        for op in ops:
            self._spares.pop(op, None)
            for key in [k for k in self._attempts if k[0] == op]:
                del self._attempts[key]

    def attempt(self, op: str, instance: int) -> Attempt | None:
        return self._attempts.get((op, instance))

    def save_attempt(self, op: str, instance: int, attempt: Attempt | None) -> None:
        if attempt is None:
            self._attempts.pop((op, instance), None)
        else:
            self._attempts[(op, instance)] = attempt

    def fail(self, failure: JobFailure) -> None:
        self._failure = self._failure or failure

    def failure(self) -> JobFailure | None:
        return self._failure

    def record_partitions(self, commit: Commit | None, op: str, progress: dict[int, PartitionProgress],
                          watermarks: dict[int, int] | None = None) -> None:
        for p in {*progress, *(watermarks or {})}:
            before, mark = self._partitions.get((op, p), (None, None))
            self._partitions[(op, p)] = (progress.get(p, before), (watermarks or {}).get(p, mark))

    def partitions(self, op: str, partitions: Iterable[int]) -> dict[int, tuple[PartitionProgress | None, int | None]]:
        return {p: self._partitions.get((op, p), (None, None)) for p in partitions}

    def record_streams(self, commit: Commit | None, op: str, progress: dict[str, tuple[bytes, Runs]]) -> None:
        for name, committed in progress.items():
            self._streams[(op, name)] = committed

    def forget_streams(self, commit: Commit | None, op: str, names: list[str]) -> None:
        for name in names:
            self._streams.pop((op, name), None)

    def drop_inputs(self, plan: JobPlan, op: str) -> None:
        for key in [k for k in self._streams if k[0] == op]:
            del self._streams[key]

    def streams(self, op: str, names: list[str]) -> list[tuple[bytes | None, Runs | None]]:
        return [self._streams.get((op, name), (None, None)) for name in names]


def _assignment_fields(assignment: Assignment, generation: int | None) -> dict:
    return {"epoch": assignment.epoch, "owners": json.dumps(list(assignment.owners)),
            "generation": assignment.epoch if generation is None else generation}


def _assignment(data: dict[bytes, bytes]) -> Assignment | None:
    return Assignment(int(data[b"epoch"]), tuple(json.loads(data[b"owners"]))) if data else None


def _int_map(data: dict) -> dict[int, int]:
    return {int(k): int(v) for k, v in data.items()}


def _partition(p: int) -> str:
    return f"p{p}"
