"""Per-key-group handover: who owns what while a fluid or batched rescale moves key groups.

Megaphone moves key groups in steps while everything else keeps running; Chi
carries each step's sync point in-band. For every moved key group the rescale
controller writes a marker into each of the key group's input streams. The old
owner processes the records before the marker, and in the same commit as that
batch records the key group's new owner here (`owners`); the new owner sees
that, restores the key group's committed state and offsets (the marker) and
goes on after it. Only that key group's records wait meanwhile.

A source partition has no input stream to mark: the controller asks its owner
(`releases`) to give it up at its next commit, with its offset. So does a key
group whose old owner is backlogged (`rescale.markerMaxLagRecords`): a marker
would wait until the owner worked through everything queued before it, and the
rescale would arrive when it is least affordable. Released at a commit, the key
group's unread records go to the new owner with its offsets and state.

Who owns a key group is the assignment in force unless `owners` names a newer
owner; a worker that restarts mid-rescale computes the same. The final switch
writes the new assignment and drops `owners` in one transaction.

With short windows the controller starts each step just after the step's key
groups fired a window (Megaphone schedules migrations at timestamp
boundaries): a key group is in transit (released, not yet taken over) for
about two batches, and a window end inside that transit delays its results by
as much; started right after one, the transit ends before the next.
"""

from __future__ import annotations

import msgpack

from .codec import encode_marker
from .keygroups import Assignment, Move
from .plan import JobPlan, key_group_lag, parse_assignment, write_assignment

# Aligning costs a step up to one window; with longer windows a transit rarely meets a window end anyway.
ALIGN_WINDOWS_UP_TO_MS = 5000


def owners(r, plan: JobPlan, op: str) -> list[int]:
    """The owner instance of every key group of `op` now."""
    keys = plan.keys
    # One MULTI: the final switch replaces the assignment and drops `owners` at once, and a worker must not
    # see the old assignment without the moves (it would take back what it gave away).
    pipe = r.pipeline(transaction=True)
    pipe.hgetall(keys.assignment(op))
    pipe.hgetall(keys.owners(op))
    assignment, moved = pipe.execute()
    current = list(parse_assignment(assignment).owners if assignment else plan.initial_assignment(op).owners)
    for kg, instance in moved.items():
        current[int(kg)] = int(instance)
    return current


def owned_by(r, plan: JobPlan, op: str, instance: int) -> tuple[int, ...]:
    return tuple(kg for kg, owner in enumerate(owners(r, plan, op)) if owner == instance)


def moved_to(r, plan: JobPlan, op: str, instance: int) -> list[int]:
    """The key groups released to `instance` by the rescale in progress."""
    return sorted(int(kg) for kg, i in r.hgetall(plan.keys.owners(op)).items() if int(i) == instance)


def steps(moves: list[Move], size: int) -> list[list[Move]]:
    """The moves in steps of `size` key groups (fluid: 1), in key-group order."""
    ordered = sorted(moves, key=lambda m: m.key_group)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def window_steps(plan: JobPlan, op: str) -> tuple[int, int] | None:
    """(window step, allowed lateness) in ms of the first windowed stage of `op`'s chain, if its windows are
    short enough to align the handover steps with (ALIGN_WINDOWS_UP_TO_MS)."""
    if plan.spec.operator(op) in plan.spec.sources:
        return None  # its partitions are released at a commit, not at markers among windowed records
    for member in plan.chain(op).operators:
        window = getattr(plan.spec.operator(member), "window", None)
        if window is not None:
            lateness = plan.spec.operator(member).allowed_lateness_ms
            return (window.step_ms, lateness) if window.step_ms <= ALIGN_WINDOWS_UP_TO_MS else None
    return None


def committed_window(r, plan: JobPlan, op: str, step: list[Move], window: tuple[int, int]) -> int | None:
    """The last window whose end (plus lateness) the committed watermark of every key group of the step has
    passed, i.e. whose results are out; None before any commit."""
    names = [plan.keys.kg_stream(e.upstream, op, m.key_group) for m in step for e in plan.edges_in(op)]
    packed = r.hmget(plan.keys.watermarks(op), names)
    if not names or any(p is None for p in packed):
        return None
    # Per stream: runs of (first upstream instance, last, watermark); a key group is as far as its slowest.
    watermark = min(mark for p in packed for _, _, mark in msgpack.unpackb(p))
    size, lateness = window
    return (watermark - lateness) // size


def start(r, plan: JobPlan, op: str, step: list[Move]) -> list[int]:
    """Ask the old owners to hand these key groups over: markers into their streams, or release requests
    (sources, and backlogged owners); returns the key groups asked for a release.

    Idempotent for a resumed controller, even one that chooses differently: a new owner skips a marker that
    names itself, and a key group released at a commit is not released again at its marker.
    """
    keys = plan.keys
    edges = plan.edges_in(op)
    backlogged = owner_lag(r, plan, op) if edges else {}
    bound = plan.spec.rescale.marker_max_lag_records
    released = [m.key_group for m in step if not edges or backlogged.get(m.source, 0) > bound]
    pipe = r.pipeline(transaction=False)
    for move in step:
        if move.key_group in released:
            pipe.hset(keys.releases(op), str(move.key_group), move.target)
            continue
        for edge in edges:
            pipe.xadd(keys.kg_stream(edge.upstream, op, move.key_group), encode_marker(move.target))
    pipe.execute()
    return released


def owner_lag(r, plan: JobPlan, op: str) -> dict[int, int]:
    """Input records produced and not yet consumed, per owner instance of `op`."""
    owner = owners(r, plan, op)
    lag: dict[int, int] = {}
    for (_, kg), records in key_group_lag(r, plan.keys, plan.edges_in(op), range(len(owner))).items():
        lag[owner[kg]] = lag.get(owner[kg], 0) + records
    return lag


def completed(r, plan: JobPlan, op: str, step: list[Move]) -> bool:
    """Whether every key group of the step was released by its old owner and taken by its new one."""
    keys = plan.keys
    fields = [str(m.key_group) for m in step]
    now = r.hmget(keys.owners(op), fields)
    taken = r.hmget(keys.acquired(op), fields)
    return all(
        owner is not None and int(owner) == m.target and by is not None and int(by) == m.target
        for m, owner, by in zip(step, now, taken)
    )


def finish(r, plan: JobPlan, op: str, new: Assignment) -> None:
    """Make the moved ownership the assignment in force, in the same generation: nobody is fenced."""
    keys = plan.keys
    generation, epoch = r.hmget(keys.assignment(op), ["generation", "epoch"])
    pipe = r.pipeline(transaction=True)
    write_assignment(pipe, keys, op, new, generation=int(generation or epoch))
    pipe.delete(keys.owners(op), keys.releases(op), keys.acquired(op))
    pipe.execute()
