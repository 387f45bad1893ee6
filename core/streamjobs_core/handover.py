"""Per-key-group handover: who owns what while a fluid or batched rescale moves key groups.

Megaphone moves key groups in steps while everything else keeps running; Chi
carries each step's sync point in-band. For every moved key group the rescale
controller writes a marker into each of the key group's input streams. The old
owner processes the records before the marker, and in the same commit as that
batch records the key group's new owner (the store's moved key groups); the new owner sees
that, restores the key group's committed state and offsets (the marker) and
goes on after it. Only that key group's records wait meanwhile.

A source partition has no input stream to mark: the controller asks its owner
(a release request) to give it up at its next commit, with its offset. So does a key
group whose old owner is backlogged (`rescale.markerMaxLagRecords`): a marker
would wait until the owner worked through everything queued before it, and the
rescale would arrive when it is least affordable. Released at a commit, the key
group's unread records go to the new owner with its offsets and state.

Who owns a key group is the assignment in force unless the moved key groups name a newer
owner; a worker that restarts mid-rescale computes the same. The final switch
writes the new assignment and drops the moved key groups in one transaction.

With short windows the controller starts each step just after the step's key
groups fired a window (Megaphone schedules migrations at timestamp
boundaries): a key group is in transit (released, not yet taken over) for
about two batches, and a window end inside that transit delays its results by
as much; started right after one, the transit ends before the next.
"""

from __future__ import annotations

from .jobstore import JobStore
from .keygroups import Assignment, Move
from .plan import JobPlan

# Aligning costs a step up to one window; with longer windows a transit rarely meets a window end anyway.
ALIGN_WINDOWS_UP_TO_MS = 5000


def current_owners(store: JobStore, plan: JobPlan, op: str) -> list[int]:
    """The owner instance of every key group of `op` now."""
    assignment, moved = store.ownership(op)
    current = list((assignment or plan.initial_assignment(op)).owners)
    for kg, instance in moved.items():
        current[kg] = instance
    return current


def owned_by(store: JobStore, plan: JobPlan, op: str, instance: int) -> tuple[int, ...]:
    return tuple(kg for kg, owner in enumerate(current_owners(store, plan, op)) if owner == instance)


def moved_to(store: JobStore, op: str, instance: int) -> list[int]:
    """The key groups released to `instance` by the rescale in progress."""
    return sorted(kg for kg, i in store.ownership(op)[1].items() if i == instance)


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
            lateness = getattr(plan.spec.operator(member), "allowed_lateness_ms", 0)  # a window join has none
            return (window.step_ms, lateness) if window.step_ms <= ALIGN_WINDOWS_UP_TO_MS else None
    return None


def committed_window(store: JobStore, plan: JobPlan, op: str, step: list[Move],
                     window: tuple[int, int]) -> int | None:
    """The last window whose end (plus lateness) the committed watermark of every key group of the step has
    passed, i.e. whose results are out; None before any commit."""
    upstreams = [e.upstream for e in plan.edges_in(op)]
    watermark = store.committed_watermark(upstreams, op, [m.key_group for m in step])
    if watermark is None:
        return None
    size, lateness = window
    return (watermark - lateness) // size


def start(store: JobStore, plan: JobPlan, op: str, step: list[Move]) -> list[int]:
    """Ask the old owners to hand these key groups over: markers into their streams, or release requests
    (sources, and backlogged owners); returns the key groups asked for a release.

    Idempotent for a resumed controller, even one that chooses differently: a new owner skips a marker that
    names itself, and a key group released at a commit is not released again at its marker.
    """
    upstreams = [e.upstream for e in plan.edges_in(op)]
    backlogged = owner_lag(store, plan, op) if upstreams else {}
    bound = plan.spec.rescale.marker_max_lag_records
    released = {m.key_group: m.target for m in step if not upstreams or backlogged.get(m.source, 0) > bound}
    if released:
        store.request_release(op, released)
    marked = {m.key_group: m.target for m in step if m.key_group not in released}
    if marked:
        store.mark(upstreams, op, marked)  # one round trip per step, however many key groups it moves
    return sorted(released)


def owner_lag(store: JobStore, plan: JobPlan, op: str) -> dict[int, int]:
    """Input records produced and not yet consumed, per owner instance of `op`."""
    owner = current_owners(store, plan, op)
    lag: dict[int, int] = {}
    upstreams = [e.upstream for e in plan.edges_in(op)]
    for (_, kg), records in store.key_group_lag(upstreams, op, range(len(owner))).items():
        lag[owner[kg]] = lag.get(owner[kg], 0) + records
    return lag


def completed(store: JobStore, op: str, step: list[Move]) -> bool:
    """Whether every key group of the step was released by its old owner and taken by its new one."""
    moved, taken = store.ownership(op)[1], store.acquired(op)
    return all(moved.get(m.key_group) == m.target and taken.get(m.key_group) == m.target for m in step)


def finish(store: JobStore, op: str, new: Assignment) -> None:
    """Make the moved ownership the assignment in force, in the same generation: nobody is fenced."""
    store.finish_handover(op, new)
