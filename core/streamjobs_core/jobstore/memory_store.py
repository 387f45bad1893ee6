"""The job store kept in this process's memory, behind the same port as the Redis store."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

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
)
from ..keygroups import Assignment
from ..plan import JobPlan
from ..watermarks import Runs
from .port import Commit

if TYPE_CHECKING:
    from ..exchange import Exchange  # which builds on this package: the memory exchange fences by this store


def _apply(commit: Commit | None, write: Callable[[], None]) -> None:
    """A record written into a commit applies with it (inside the memory exchange's commit, after its fence
    check); outside one (a controller's write, a test's setup), at once."""
    if commit is None:
        write()
    else:
        commit.apply_in_commit(write)


class MemoryJobStore:
    """The job store in dictionaries: for unit tests of the control logic and jobs run in one process. Records
    written into a commit apply with it; what fences a commit (incarnations, the assignment and its
    generation) changes under `lock`, which the memory exchange holds while it checks and applies one."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._plan: JobPlan | None = None
        self._owner: str | None = None
        self._assignments: dict[str, tuple[Assignment, int]] = {}
        self._upcoming: dict[str, Assignment] = {}
        self._moved: dict[str, dict[int, int]] = {}
        self._asked: dict[str, dict[int, int]] = {}
        self._acquired: dict[str, dict[int, int]] = {}
        self._incarnations: dict[tuple[str, int], int] = {}
        self._exchange: Exchange | None = None
        self.markers: list[tuple[str, str, int, int]] = []  # (upstream, op, kg, target), as placed
        self._rescale: RescaleState | None = None
        self._history: list[RescaleRecord] = []
        self._requests: list[RescaleRequest] = []
        self._standbys: dict[str, dict[int, int]] = {}
        self._standby_lag: dict[str, dict[int, int]] = {}
        self._spares: dict[str, set[str]] = {}
        self._promotions: dict[tuple[str, str], list[Promotion]] = {}
        self._demotions: dict[tuple[str, int], str] = {}
        self._pod_roles: dict[tuple[str, int], int] = {}
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
        self._decisions: list[dict] = []
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
        """Every record goes (this store holds no input streams); its lock and exchange stay, which the memory
        exchange fences and is read by."""
        records = len(self._assignments) + len(self._history)
        lock, exchange = self.lock, self._exchange
        self.__init__()
        self.lock, self._exchange = lock, exchange
        return records

    def assignment(self, op: str) -> Assignment | None:
        return self._assignments[op][0] if op in self._assignments else None

    def generation(self, op: str) -> int | None:
        return self._assignments[op][1] if op in self._assignments else None

    def upcoming_assignment(self, op: str) -> Assignment | None:
        return self._upcoming.get(op)

    def write_assignment(self, op: str, assignment: Assignment, generation: int | None = None) -> None:
        with self.lock:
            self._assignments[op] = (assignment, assignment.epoch if generation is None else generation)

    def publish_upcoming(self, op: str, assignment: Assignment) -> None:
        self._upcoming[op] = assignment

    def ownership(self, op: str) -> tuple[Assignment | None, dict[int, int]]:
        return self.assignment(op), dict(self._moved.get(op, {}))

    def release_in(self, commit: Commit | None, op: str, releases: dict[int, int]) -> None:
        releases = dict(releases)  # as it is now: the commit applies it later

        def write() -> None:
            self._moved.setdefault(op, {}).update(releases)

        _apply(commit, write)

    def request_release(self, op: str, releases: dict[int, int]) -> None:
        self._asked.setdefault(op, {}).update(releases)

    def release_requests(self, op: str) -> dict[int, int]:
        return dict(self._asked.get(op, {}))

    def attach(self, exchange: Exchange) -> None:
        """The exchange the job's records flow through (MemoryExchange attaches itself): markers go into its
        kg streams, and the pacing reads count what its commits counted. Without one no record flows."""
        self._exchange = exchange

    def mark(self, upstreams: Iterable[str], op: str, targets: dict[int, int]) -> None:
        upstreams = list(upstreams)
        self.markers.extend((upstream, op, kg, target) for kg, target in targets.items() for upstream in upstreams)
        if self._exchange is not None:
            for kg, target in targets.items():
                for upstream in upstreams:
                    self._exchange.append(self._plan.keys.kg_stream(upstream, op, kg), encode_marker(target))

    def record_acquired(self, op: str, kgs: Iterable[int], instance: int) -> None:
        self._acquired.setdefault(op, {}).update({kg: instance for kg in kgs})

    def acquired(self, op: str) -> dict[int, int]:
        return dict(self._acquired.get(op, {}))

    def finish_handover(self, op: str, new: Assignment) -> None:
        self.write_assignment(op, new, self.generation(op))
        for records in (self._moved, self._asked, self._acquired):
            records.pop(op, None)

    def new_incarnation(self, op: str, instance: int) -> int:
        with self.lock:
            self._incarnations[(op, instance)] = self._incarnations.get((op, instance), 0) + 1
            return self._incarnations[(op, instance)]

    def fencing(self, op: str, instance: int) -> tuple[int | None, int | None]:
        """(the instance's incarnation now, its operator's assignment generation): read under `lock`."""
        return self._incarnations.get((op, instance)), self.generation(op)

    def key_group_lag(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[tuple[str, int], int]:
        kgs, keys = list(kgs), self._plan.keys
        return {(u, kg): p - c for u in upstreams
                for kg, p, c in zip(kgs, self._counts(keys.produced(u, op), kgs),
                                    self._counts(keys.consumed(u, op), kgs))}

    def consumed(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[int, int]:
        kgs = list(kgs)
        out = dict.fromkeys(kgs, 0)
        for u in upstreams:
            for kg, n in zip(kgs, self._counts(self._plan.keys.consumed(u, op), kgs)):
                out[kg] += n
        return out

    def _counts(self, key: str, kgs: list[int]) -> list[int]:
        """Each key group's count in a hash of the exchange's counts (records produced into or consumed from),
        read at once."""
        if self._exchange is None:
            return [0] * len(kgs)
        return [int(n or 0) for n in self._exchange.hash_fields(key, [str(kg) for kg in kgs])]

    def state_logs(self, op: str, key_groups: int) -> list[tuple[bytes | None, list[tuple[bytes, dict]]]]:
        """Per key group of `op`: its snapshot (None without one) and every entry of its changelog."""
        if self._exchange is None:
            return [(None, [])] * key_groups
        keys = self._plan.keys
        changelogs = self._exchange.after({keys.changelog(op, kg): None for kg in range(key_groups)})
        return [(self._exchange.value(keys.snapshot(op, kg)), changelogs[keys.changelog(op, kg)])
                for kg in range(key_groups)]

    def committed_watermark(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> int | None:
        names = [self._plan.keys.kg_stream(u, op, kg) for kg in kgs for u in upstreams]
        committed = [self._streams.get((op, name), (None, None))[1] for name in names]
        if not committed or None in committed:
            return None
        return min(mark for runs in committed for _, _, mark in runs)

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
        kgs = list(kgs)

        def write() -> None:
            self._versions.setdefault(op, {}).update({kg: version for kg in kgs})

        _apply(commit, write)

    def versions(self, op: str) -> dict[int, int]:
        return dict(self._versions.get(op, {}))

    def record_cut(self, commit: Commit | None, op: str, version: int, offsets: dict[int, int | bytes]) -> None:
        offsets = dict(offsets)

        def write() -> None:
            self._cuts.setdefault(version, {}).update({(op, p): str(o).encode() if isinstance(o, int) else o
                                                       for p, o in offsets.items()})

        _apply(commit, write)

    def cut(self, version: int) -> dict[tuple[str, int], bytes]:
        return dict(self._cuts.get(version, {}))

    def record_aligned(self, commit: Commit | None, op: str, instance: int, version: int, ms: float) -> None:
        def write() -> None:
            self._aligned.setdefault(version, {})[f"{op}/{instance}"] = ms

        _apply(commit, write)

    def aligned(self, version: int) -> dict[str, float]:
        return dict(self._aligned.get(version, {}))

    def record_reset(self, commit: Commit | None, op: str, version: int, watermarks: dict[int, int]) -> None:
        watermarks = dict(watermarks)

        def write() -> None:
            self._resets.setdefault((version, op), {}).update(watermarks)

        _apply(commit, write)

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
        def write() -> None:
            self._replies.setdefault(event, {})[f"{op}/{instance}"] = json.loads(reply)

        _apply(commit, write)

    def replies(self, event: str) -> dict[str, object]:
        return dict(self._replies.get(event, {}))

    def record_decision(self, entry: dict, keep: int) -> None:
        self._decisions = [*self._decisions, entry][-keep:]

    def decisions(self) -> list[dict]:
        return list(self._decisions)

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

    def spare_gone(self, op: str, spare: str) -> None:
        self._spares.get(op, set()).discard(spare)

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

    def promote_pod(self, op: str, ordinal: int, epoch: int) -> None:
        self._pod_roles[(op, ordinal)] = epoch

    def demote_pods(self, op: str, ordinals: list[int]) -> None:
        for ordinal in ordinals:
            self._pod_roles.pop((op, ordinal), None)

    def promoted_pod(self, op: str, ordinal: int) -> int | None:
        return self._pod_roles.get((op, ordinal))

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
        progress, watermarks = dict(progress), dict(watermarks or {})

        def write() -> None:
            for p in {*progress, *watermarks}:
                before, mark = self._partitions.get((op, p), (None, None))
                self._partitions[(op, p)] = (progress.get(p, before), watermarks.get(p, mark))

        _apply(commit, write)

    def partitions(self, op: str, partitions: Iterable[int]) -> dict[int, tuple[PartitionProgress | None, int | None]]:
        return {p: self._partitions.get((op, p), (None, None)) for p in partitions}

    def record_streams(self, commit: Commit | None, op: str, progress: dict[str, tuple[bytes, Runs]]) -> None:
        progress = dict(progress)

        def write() -> None:
            for name, committed in progress.items():
                self._streams[(op, name)] = committed

        _apply(commit, write)

    def forget_streams(self, commit: Commit | None, op: str, names: list[str]) -> None:
        names = list(names)
        if commit is not None:
            for name in names:
                commit.delete(name)  # the stream too, in the exchange the commit goes to

        def write() -> None:
            for name in names:
                self._streams.pop((op, name), None)

        _apply(commit, write)

    def drop_inputs(self, plan: JobPlan, op: str) -> None:
        for key in [k for k in self._streams if k[0] == op]:
            del self._streams[key]

    def streams(self, op: str, names: list[str]) -> list[tuple[bytes | None, Runs | None]]:
        return [self._streams.get((op, name), (None, None)) for name in names]
