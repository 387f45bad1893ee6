"""Live reconfiguration: a running job's spec changes without a stop, at a consistent cut.

What may change live is decided field by field (`diff`): a stage's logic
(`query`, `function`, `where`, `select`, ...), `onError`, `simulatedCostUs`,
a sink's settings, batching and snapshot settings, and the graph: a stage, a
sink or a source added, a stateless stage, a sink or a source removed, in a
chain or on workers of their own (chaining.py). A chain a version adds gets its
workers before anything switches; one it removes passes the barriers on and is
stopped once the version is complete. What stays is who writes each stream
between chains: an operator joining or leaving a chain that goes on would give
a stream a second writer across the cut, and is refused.
A stateful stage keeps its state only while its key and its state's meaning
stay: its key, window, aggregations, join bounds or state schema cannot change
live unless its state is reset, and such a change is refused with the field
named, never applied with the state dropped. Aggregations added after a
window's or an `over` stage's others are the exception: the state stays. An
added one covers the records processed under it: in a window, those that
reach it after the switch (null in a window none of them reached); in `over`,
each record read after the switch, over its whole frame (the history holds
records), and the records waiting at the switch go out with it null.
Parallelism is a rescale (rescale.py), done after the live part.

How it happens (Chi's control events, carried like Flink's checkpoint
barriers): the controller publishes plan version v and asks the sources to
switch. Each source instance switches at its next commit: the offsets of that
commit are the cut, recorded per partition, and it writes a barrier (codec.py)
into every stream it feeds, in the same commit. A downstream instance keeps
reading, but holds back what its producers wrote after their barriers until
every producer of every key group it owns has passed one (alignment); then,
in one commit, it processes what came before under the old plan, writes its
own barriers, switches, and processes what came after under the new plan.
So every record is processed under the plan in force at its source offset, by
every operator, and a record is never processed under both or neither. Each
key group records its version in the switching commit: a worker restarted
mid-way runs the version its key groups are at and meets the same barriers again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from .chaining import chains
from .control import ControlEvent, ControlRecord, ReconfigureRecord, ReconfigureState
from .jobstore import JobStore
from .plan import JobPlan
from .rescale import Fleet
from .spec import BUILT_IN_HANDLERS, StreamJob

# Fields of a stateful stage that give its state its meaning: changed, the state would be read wrongly.
_STATE_FIELDS = {
    "window_aggregate": ("keyBy", "window", "aggregations"),
    "stateful": ("keyBy", "stateSchema"),
    "join": ("on", "kind", "window", "lowerMs", "upperMs", "ttlMs", "how"),
    "over": ("keyBy", "rows", "orderBy", "aggregations"),
}
# Fields that shape the graph: the chains, the streams between operators and their partitioning.
_SHAPE_FIELDS = ("type", "inputs", "chain")
OPERATOR_GROUPS = ("sources", "stages", "sinks")  # the spec's lists of operators


class How(StrEnum):
    LIVE = "live"
    RESCALE = "rescale"
    REFUSED = "refused"


@dataclass(frozen=True)
class Change:
    path: str  # as in the spec: spec.stages[enrich].query
    how: How
    reason: str = ""
    operator: str | None = None  # the operator it belongs to, if any

    def describe(self) -> str:
        return f"{self.path}: {self.how.value}" + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class Reconfiguration:
    """What a new spec changes in a running job, field by field."""

    changes: tuple[Change, ...]

    @property
    def refused(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.how is How.REFUSED)

    @property
    def live(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.how is How.LIVE)

    @property
    def rescales(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.how is How.RESCALE)

    def lines(self) -> list[str]:
        return [c.describe() for c in self.changes] or ["no change"]


class Refused(ValueError):
    """A change that cannot be made to the running job; the message names each field and why."""

    def __init__(self, changes: tuple[Change, ...]) -> None:
        super().__init__("; ".join(c.describe() for c in changes))
        self.changes = changes


# How the job runs or starts, not what it computes: the operator and the runtime act on them themselves.
_NOT_THE_JOBS = ("suspend", "restoreFrom")


def diff(old: StreamJob, new: StreamJob, reset: Iterable[str] = (), restoring: bool = False) -> Reconfiguration:
    """Classify every field `new` changes against the running `old`. The stateful stages in `reset` start
    their state afresh at the cut, so what their state depends on may change too. `restoring`: `old` is a
    savepoint's job, which a restore may split again under another maxParallelism (resplit.py)."""
    a, b = (job.spec.model_dump(mode="json", by_alias=True) for job in (old, new))
    reset = tuple(reset)
    changes: list[Change] = [_reset(name, a, b) for name in reset]
    if old.metadata.name != new.metadata.name:
        changes.append(Change("metadata.name", How.REFUSED, "a different job"))
    for key in sorted(a.keys() | b.keys()):
        if key in OPERATOR_GROUPS or key in _NOT_THE_JOBS or a.get(key) == b.get(key):
            continue
        changes.extend(_settings(key, a.get(key), b.get(key), restoring))
    changes.extend(_rewritten(old.spec, new.spec))
    for group in OPERATOR_GROUPS:
        before = {op["name"]: op for op in a[group]}
        after = {op["name"]: op for op in b[group]}
        for name in sorted(before.keys() ^ after.keys()):
            changes.append(_added_or_removed(group, (after if name in after else before)[name], name in after))
        for name in sorted(before.keys() & after.keys()):
            changes.extend(_operator(group, before[name], after[name], name in reset))
    return Reconfiguration(tuple(changes))


def _rewritten(old, new) -> list[Change]:
    """Streams between chains that other workers would write after the cut than before it (an operator joining
    or leaving a chain that goes on): what they wrote after their barriers would mix with the old writers'
    records before theirs. A stream gets a new name when its writer changes: a chain's tail, or a consumer."""
    before, after = _writers(old), _writers(new)
    return [Change(f"spec.{_group(new, tail)}[{tail}]", How.REFUSED,
                   f"its stream to '{consumer}' would be written by the workers of '{after[tail, consumer]}' after "
                   f"the cut and of '{before[tail, consumer]}' before it (a chain splits or joins another): it "
                   "needs a new job", tail)
            for tail, consumer in sorted(before.keys() & after.keys())
            if before[tail, consumer] != after[tail, consumer]]


def _writers(spec) -> dict[tuple[str, str], str]:
    """(chain tail, consuming chain head) -> the head whose workers write that stream."""
    return {(c.tail, consumer.name): c.head for c in chains(spec) for consumer in spec.consumers(c.tail)}


def _group(spec, name: str) -> str:
    return next(g for g in OPERATOR_GROUPS if any(op.name == name for op in getattr(spec, g)))


def _added_or_removed(group: str, op: dict, added: bool) -> Change:
    """An operator comes or goes at the cut, in a chain or on workers of its own (the controller starts and
    stops those). A stateful stage added starts empty; one removed would drop windows and rows still open."""
    path, name = f"spec.{group}[{op['name']}]", op["name"]
    if group == "sources" and added and op["type"] != "redis_stream":
        return Change(path, How.REFUSED, f"a {op['type']} generator's event time runs from the job's start: added "
                      "live it would emit everything since then at once, all of it late; a redis_stream source can "
                      "be added (its input read from its start), or start a new job", name)
    if group == "sources":
        return Change(path, How.LIVE, "its input read from its start, under the new plan" if added
                      else "its input is no longer read from the cut on", name)
    if op["type"] in _STATE_FIELDS:
        if added:
            return Change(path, How.LIVE, "its state starts empty at the cut: it sees the records after it", name)
        return Change(path, How.REFUSED, f"removing a {op['type']} stage would drop the state it holds (windows "
                      "and rows not emitted yet): it needs a new job", name)
    return Change(path, How.LIVE, "added at the cut" if added else "removed at the cut", name)


def _reset(name: str, old: dict, new: dict) -> Change:
    """The reset of a stage's state asked for: live where the stage is stateful in both specs."""
    stateful = [next((op for op in spec["stages"] if op["name"] == name and op["type"] in _STATE_FIELDS), None)
                for spec in (old, new)]
    if None in stateful:
        return Change(f"spec.stages[{name}]", How.REFUSED, "--reset-state names a stateful stage of the job", name)
    return Change(f"spec.stages[{name}]", How.LIVE, "--reset-state: its state starts afresh at the cut; windows "
                  "and rows it holds then are dropped", name)


def _settings(key: str, old, new, restoring: bool) -> list[Change]:
    if key == "maxParallelism" and restoring:
        return [Change("spec.maxParallelism", How.LIVE, f"{old} -> {new}: every key group's state and records "
                       "in flight split again by key at the restore")]
    if key == "maxParallelism":
        return [Change("spec.maxParallelism", How.REFUSED, "it maps keys to other key groups: take a savepoint "
                       "(`streamjobs savepoint`) and go on from it under the new value, which splits the state "
                       "again")]
    if key in ("batching", "rescale", "controlHandlers"):
        return [Change(f"spec.{key}.{f}", How.LIVE) for f in _changed_fields(old, new)]
    if key == "state":
        return [Change(f"spec.state.{f}", How.LIVE if f == "snapshotEveryBatches" else How.REFUSED,
                       "" if f == "snapshotEveryBatches" else "where the state lives: it needs a new job")
                for f in _changed_fields(old, new)]
    return [Change(f"spec.{key}", How.REFUSED, "read when the job starts: it needs a new job")]


def _operator(group: str, old: dict, new: dict, reset: bool) -> list[Change]:
    path = f"spec.{group}[{old['name']}]"
    out = []
    for f in _changed_fields(old, new):
        where = f"{path}.{f}"
        name = old["name"]
        if f == "parallelism":
            out.append(Change(where, How.RESCALE, f"{old[f]} -> {new[f]}", name))
        elif f == "type":
            out.append(Change(where, How.REFUSED, "another kind of operator: it needs a new job", name))
        elif f == "inputs" and old["type"] == "join" and not reset:
            out.append(Change(where, How.REFUSED, "a join's state is kept per side: keep its inputs, or start "
                              f"its state afresh (--reset-state {name})", name))
        elif f in _SHAPE_FIELDS:
            out.append(Change(where, How.LIVE, "the graph changes at the cut", name))
        elif group == "sources":
            out.append(Change(where, How.REFUSED, "a source's settings define its input: it needs a new job", name))
        elif f == "aggregations" and old["type"] in _APPENDABLE and not reset and _appended(old[f], new[f]):
            out.append(Change(where, How.LIVE, f"aggregations only added: {_APPENDABLE[old['type']]}", name))
        elif f in _STATE_FIELDS.get(old.get("type"), ()) and not reset:
            out.append(Change(where, How.REFUSED, f"the {old['type']} state depends on it: keep it, or start "
                              f"its state afresh (--reset-state {name}; on Kubernetes, the annotation "
                              f"streamjobs.dev/reset-state: {name})", name))
        else:
            out.append(Change(where, How.LIVE, operator=name))
    return out


# Stages whose aggregations may be added to live, and what an added one covers.
_APPENDABLE = {
    "window_aggregate": "the state keeps the others; an added one covers the records processed under it, null "
                        "in a window none of them reached",
    "over": "the state keeps records, so an added one covers each record read from the switch on over its whole "
            "frame; records waiting at the switch go out with it null",
}


def _appended(old: list, new: list) -> bool:
    """Whether `new` is `old` with aggregations added after it: a window's partials are stored by position, and
    an `over` stage tells the added ones by it."""
    return len(new) > len(old) and new[:len(old)] == old


def _changed_fields(old: dict, new: dict) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def holds_back(old: JobPlan, new: JobPlan, operators: tuple[str, ...]) -> bool:
    """Whether instances running `operators` (a chain) must align on `new`'s barriers: hold back what each
    producer wrote after its barrier until every producer passed one. Only when one of them, or an operator
    downstream of them, computes differently under `new` or is its control event's target. Elsewhere a record
    is processed the same under either plan, and no operator downstream tells the two apart, so an instance
    reads through its barriers and switches once the last has passed, holding nothing back (Flink's aligned
    checkpoints hold every channel; a reconfiguration needs to hold only where the cut shows)."""
    before = {op.name: op for op in old.spec.operators}
    after = {op.name for op in new.spec.operators}
    # Added, changed and removed operators (a chain whose member went computes differently too).
    affected = {op.name for op in new.spec.operators if op != before.get(op.name)} | (before.keys() - after)
    affected |= set(new.resets)
    if new.control is not None:
        affected.add(new.control.operator)
    reach, frontier = set(operators), list(operators)
    while frontier:
        for consumer in new.spec.consumers(frontier.pop()):
            if consumer.name not in reach:
                reach.add(consumer.name)
                frontier.append(consumer.name)
    return bool(reach & affected)


def plan_for(store: JobStore, op: str) -> JobPlan:
    """The plan a starting worker of chain head `op` reads its assignment from: the latest; the version being
    prepared, for a chain it adds (its workers start before the sources switch); or, for a chain a later
    version removed, the last with it (plan_in_force then tells whether its key groups passed the removal)."""
    latest = store.plan()
    if op in latest.vertices:
        return latest
    prepared = store.plan_version(latest.version + 1)
    if prepared is not None and op in prepared.vertices:
        return prepared
    return next((p for p in reversed(store.plans()) if op in p.vertices), latest)


def plan_in_force(store: JobStore, plan: JobPlan, op: str, owned: tuple[int, ...]) -> JobPlan:
    """The plan version the key groups (source partitions) `owned` of chain head `op` switched to last: what a
    (re)starting instance of them runs. They switch together, in one instance's commit."""
    if not owned:
        return plan
    versions = store.versions(op)
    found = {versions.get(kg, 0) for kg in owned}
    if len(found) > 1:  # one instance switches all it owns in one commit, and no rescale runs meanwhile
        raise RuntimeError(f"{op}: owned key groups are at plan versions {sorted(found)}")
    version = found.pop()
    if version == plan.version:
        return plan
    earlier = store.plan_version(version)
    if earlier is None:
        raise LookupError(f"{op}: key groups at plan version {version}, which the job store no longer holds")
    return earlier


class ReconfigureController:
    """Publishes a new plan version and waits until every key group of every chain switched to it.

    One reconfiguration at a time, and none while a rescale runs: the caller (the local runtime, the
    operator) serialises them. Resumable: a controller that died leaves the version published and the
    barriers on their way; `resume` waits for them again.
    """

    def __init__(self, store: JobStore, timeout_s: float = 180.0, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, fleet: Fleet | None = None) -> None:
        self._store = store
        self._timeout_s = timeout_s
        self._sleep = sleep
        self._clock = clock
        self._fleet = fleet  # starts and stops the workers of chains a version adds or removes

    def apply(self, job: StreamJob, request: str | None = None, restart: Fleet | None = None,
              reset: tuple[str, ...] = ()) -> tuple[Reconfiguration, ReconfigureRecord | None]:
        """Check `job` against the running plan; refused changes raise Refused (nothing is applied). Live
        changes are applied; returns the classification and the record (None when nothing changes live).
        The stateful stages in `reset` start their state afresh at the cut.

        A chain the new plan adds (an operator on workers of its own) gets its workers before the sources
        are asked to switch: they run the new version from the start, reading streams its producers write
        only after their barriers. A chain it removes passes the barriers on, and its workers stop once the
        version is complete.

        With `restart`, the same change the way Flink makes it, the baseline: every worker stops after its
        last commit (which is then the cut), and the job starts again on the new plan."""
        self.resume()  # one at a time: a version still on its way goes first
        running = self._store.plan()
        changes = diff(running.job, job, reset)
        if changes.refused:
            raise Refused(changes.refused)
        if not changes.live:
            return changes, None
        version = running.version + 1
        state = ReconfigureState(version, time.time(), tuple(c.describe() for c in changes.live), request)
        # Parallelism stays the running one: the rescale that follows changes it, through its own controller.
        new = JobPlan(_with_parallelism(job, running.job), running.t0_ms, version, resets=tuple(reset),
                      kept_partitions=running.kept_partitions)
        added = {op: new.spec.operator(op).parallelism for op in new.vertices if op not in running.vertices}
        fleet = restart or self._fleet
        if (added or set(running.vertices) - set(new.vertices)) and fleet is None:
            raise RuntimeError("this change starts or stops workers, and the controller was given no fleet")
        if restart is not None:
            parallelism = {op: self._store.assignment(op).parallelism for op in running.vertices}
            restart.stop_job()
        if added:
            self._store.prepare_plan(new, tuple(added))
        if restart is not None:
            self._store.publish_plan(new, state)
            restart.start_job({**parallelism, **added})
        else:
            try:
                for op, parallelism in added.items():
                    fleet.start_chain(op, parallelism)
            except BaseException:  # nothing switched: the job goes on as it was, without the new chains
                for op in added:
                    fleet.stop_chain(op)
                self._store.withdraw_plan(new, tuple(added))
                raise
            self._store.publish_plan(new, state)
        return changes, self._await(state, fleet)

    def deliver(self, event: ControlEvent) -> ControlRecord:
        """Deliver a control event to every instance of its operator at a sync point (Chi): it travels as a
        plan version of its own, the running spec unchanged, so each instance meets it between the same
        records as every other operator; each replies in its switching commit. A name the job has no handler
        for, or an operator it has not, is refused before anything is sent."""
        self.resume()
        running = self._store.plan()
        spec = running.spec
        refused = None
        if event.operator not in {op.name for op in spec.operators}:
            refused = f"no operator '{event.operator}' (operators: {', '.join(op.name for op in spec.operators)})"
        elif event.name not in BUILT_IN_HANDLERS and event.name not in spec.handlers:
            known = (*BUILT_IN_HANDLERS, *spec.handlers)
            refused = f"no handler for event '{event.name}' (spec.controlHandlers and built-ins: {', '.join(known)})"
        if refused is not None:
            record = ControlRecord(event, None, {}, refused=refused)
            self._store.end_control(record)
            return record
        state = ReconfigureState(running.version + 1, time.time(), (f"control {event.name} -> {event.operator}",),
                                 event.id)
        self._store.publish_plan(replace(running, version=state.version, control=event, resets=()), state)
        self._await(state, self._fleet)
        return next(r for r in reversed(self._store.control_history()) if r.event.id == event.id)

    def resume(self) -> ReconfigureRecord | None:
        state = self._store.reconfigure_state()
        return None if state is None else self._await(state, self._fleet)

    def _await(self, state: ReconfigureState, fleet: Fleet | None) -> ReconfigureRecord:
        plan = self._store.plan_version(state.version)
        deadline = self._clock() + self._timeout_s
        while waiting := self.waiting(plan):
            if self._clock() > deadline:
                raise TimeoutError(f"plan version {state.version}: key groups not switched yet: "
                                   + ", ".join(f"{op} {n}" for op, n in waiting.items()))
            self._sleep(0.1)
        aligned = self._store.aligned(state.version)
        record = ReconfigureRecord(state.version, state.changes, state.request,
                                   round(time.time() - state.started_at, 3), max(aligned.values(), default=0.0),
                                   aligned)
        control = None
        if plan.control is not None:  # its replies came with the switches just awaited
            control = ControlRecord(plan.control, plan.version, self._store.replies(plan.control.id),
                                    record.duration_s, record.pause_ms)
        previous, removed = self._removed(plan)
        if removed and fleet is not None:  # they passed their barriers on: nothing reads what they would write
            for op in removed:
                fleet.stop_chain(op)
                self._store.drop_inputs(previous, op)
        self._store.end_reconfigure(record, control)
        return record

    def _removed(self, plan: JobPlan) -> tuple[JobPlan | None, list[str]]:
        """The version before `plan`, and the chain heads it had that `plan` removed."""
        previous = self._store.plan_version(plan.version - 1)
        return previous, [] if previous is None else [op for op in previous.vertices if op not in plan.vertices]

    def waiting(self, plan: JobPlan) -> dict[str, int]:
        """Per chain head: how many of its key groups (source partitions) have not switched to `plan` yet. A
        chain `plan` removed switches too: its instances pass the barriers on, then wait to be stopped."""
        previous, removed = self._removed(plan)
        heads = [(op, plan) for op in plan.vertices] + [(op, previous) for op in removed]
        out = {}
        for op, where in heads:
            versions = self._store.versions(op)
            behind = sum(1 for kg in range(where.key_groups(op)) if versions.get(kg, 0) < plan.version)
            if behind:
                out[op] = behind
        return out


def ask(store: JobStore, event: ControlEvent, timeout_s: float, sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic) -> ControlRecord:
    """From outside the runtime (`streamjobs control`): have the running job deliver `event`; its record."""
    before = len(store.control_history())
    store.request_control(event)
    deadline = clock() + timeout_s
    while (record := next((r for r in store.control_history(before) if r.event.id == event.id), None)) is None:
        if clock() > deadline:
            raise TimeoutError(f"control event {event.name}: not answered within {timeout_s:.0f} s")
        sleep(0.2)
    return record


def _with_parallelism(job: StreamJob, running: StreamJob) -> StreamJob:
    """`job` at the running parallelism, as the running job (its metadata: its keys stay where they are); an
    operator it adds runs at its input's when it joins that chain, at its own on workers of its own."""
    spec = job.spec
    running_names = {op.name for op in running.spec.operators}
    head = {member: c.head for c in chains(spec) for member in c.operators}
    parallelism: dict[str, int] = {}
    for name in spec.topological_order():
        op = spec.operator(name)
        if name in running_names:
            parallelism[name] = running.spec.operator(name).parallelism
        elif head[name] != name:
            parallelism[name] = parallelism[op.inputs[0]]
        else:
            parallelism[name] = op.parallelism
    groups = {group: tuple(op.model_copy(update={"parallelism": parallelism[op.name]}) for op in getattr(spec, group))
              for group in OPERATOR_GROUPS}
    return job.model_copy(update={"metadata": running.metadata, "spec": spec.model_copy(update=groups)})


__all__ = ["Change", "How", "Reconfiguration", "ReconfigureController", "Refused", "ask", "diff",
           "holds_back", "plan_for", "plan_in_force"]
