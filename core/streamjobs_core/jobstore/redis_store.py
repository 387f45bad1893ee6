"""The job store in the job's Redis slot (layout.py): a worker's writes join its commit's transaction."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

from .. import keycopy
from ..codec import encode_marker
from ..control import (
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
from ..keygroups import Assignment
from ..layout import JobKeys
from ..plan import JobPlan
from ..watermarks import Runs, decode_runs, encode_runs
from .port import ChangeInProgress, Commit


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
        dropped: none runs), every key group of every chain head under `plan`'s version, the consumers' streams
        (from their start, with the watermarks they heard) and the record of the version."""
        pipe.hset(self.keys.plans, str(previous.version), previous.to_json())
        pipe.set(self.keys.plan, plan.to_json())
        for head in previous.vertices:
            pipe.delete(self.keys.versions(head))
            pipe.hset(self.keys.versions(head), mapping={kg: plan.version for kg in range(plan.key_groups(head))})
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

    def record_decision(self, entry: dict, keep: int) -> None:
        """An autoscaler decision, the last `keep` kept."""
        pipe = self.r.pipeline()
        pipe.rpush(self.keys.autoscaler_decisions, json.dumps(entry))
        pipe.ltrim(self.keys.autoscaler_decisions, -keep, -1)
        pipe.execute()

    def decisions(self) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(self.keys.autoscaler_decisions, 0, -1)]

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

    def spare_gone(self, op: str, spare: str) -> None:
        self.r.hdel(self.keys.spares(op), spare)

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

    def promote_pod(self, op: str, ordinal: int, epoch: int) -> None:
        self.r.hset(self.keys.pod_roles(op), str(ordinal), str(epoch))

    def demote_pods(self, op: str, ordinals: list[int]) -> None:
        if ordinals:
            self.r.hdel(self.keys.pod_roles(op), *map(str, ordinals))

    def promoted_pod(self, op: str, ordinal: int) -> int | None:
        epoch = self.r.hget(self.keys.pod_roles(op), str(ordinal))
        return None if epoch is None else int(epoch)

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


    # --- a re-split's data (resplit.py): every key group's state and records, read, then replaced at once ---------
    def transaction(self):
        """A MULTI/EXEC pipeline: a re-split's writes land together or not at all."""
        return self.r.pipeline(transaction=True)

    def state_logs(self, op: str, key_groups: int) -> list[tuple[bytes | None, list[tuple[bytes, dict]]]]:
        """Per key group of `op`: its snapshot (None without one) and every entry of its changelog."""
        pipe = self.r.pipeline(transaction=False)
        for kg in range(key_groups):
            pipe.get(self.keys.snapshot(op, kg))
            pipe.xrange(self.keys.changelog(op, kg))
        found = pipe.execute()
        return list(zip(found[::2], found[1::2]))

    def unread(self, upstream: str, op: str, cursors: list[bytes | None]) -> list[tuple[str, list[tuple[bytes, dict]]]]:
        """Per key group of the edge `upstream` -> `op` (cursors[kg], the consumer's): its stream's name and the
        entries after that cursor (all of them without one)."""
        pipe = self.r.pipeline(transaction=False)
        names = [self.keys.kg_stream(upstream, op, kg) for kg in range(len(cursors))]
        for name, cursor in zip(names, cursors):
            pipe.xrange(name, min=b"(" + cursor if cursor is not None else b"-")
        return list(zip(names, pipe.execute()))

    def replace_state(self, pipe, op: str, old_key_groups: int, snapshots: dict[int, bytes], covered: bytes) -> None:
        """Queue on `pipe`: `op`'s snapshots and changelogs of its `old_key_groups` dropped, `snapshots` (per new
        key group) in their place, each covering changelog entry `covered`."""
        pipe.delete(self.keys.snapshot_ids(op), *(k for kg in range(old_key_groups)
                                                  for k in (self.keys.snapshot(op, kg), self.keys.changelog(op, kg))))
        for kg, data in snapshots.items():
            pipe.set(self.keys.snapshot(op, kg), data)
            pipe.hset(self.keys.snapshot_ids(op), str(kg), covered)

    def replace_records(self, pipe, upstream: str, op: str, old_key_groups: int,
                        entries: dict[int, tuple[dict, int]]) -> None:
        """Queue on `pipe`: the records between `upstream` and `op` replaced by `entries`, per new key group one
        stream entry and its count of records (what the producer counts as written to it)."""
        pipe.delete(self.keys.produced(upstream, op), self.keys.consumed(upstream, op),
                    *(self.keys.kg_stream(upstream, op, kg) for kg in range(old_key_groups)))
        for kg, (fields, records) in entries.items():
            pipe.xadd(self.keys.kg_stream(upstream, op, kg), fields)
            pipe.hset(self.keys.produced(upstream, op), str(kg), records)


def _assignment_fields(assignment: Assignment, generation: int | None) -> dict:
    return {"epoch": assignment.epoch, "owners": json.dumps(list(assignment.owners)),
            "generation": assignment.epoch if generation is None else generation}


def _assignment(data: dict[bytes, bytes]) -> Assignment | None:
    return Assignment(int(data[b"epoch"]), tuple(json.loads(data[b"owners"]))) if data else None


def _int_map(data: dict) -> dict[int, int]:
    return {int(k): int(v) for k, v in data.items()}


def _partition(p: int) -> str:
    return f"p{p}"
