"""Key-group re-split: a savepoint goes on under another maxParallelism.

A key's key group is its hash modulo maxParallelism, so another maxParallelism sends most keys to other key
groups: every keyed row of state and every record between operators would be in the wrong place. Flink
redistributes state at a restore only within the key groups it has (its max parallelism is fixed for a
job's life); here everything keyed is split again by its key (statelog.row_key_groups for state rows, the
edge's routing key for records), in the savepoint as it was taken, running or stopped:

- state: each stateful stage's key groups are read (snapshot plus changelog), their rows split by the key
  groups of their keys under the new maxParallelism, and written as one snapshot per new key group;
- records between chains that their consumers had not read: routed again as their producers would route
  them now, into the new key groups' streams, which the consumers read from their start;
- watermarks: per edge, every new key group starts from the least watermark the old ones had heard, and
  records in flight carry it too. A key group whose watermark was ahead fired its windows up to it, and its
  producers had promised nothing earlier, so no on-time record meets a window that fired; and none is late
  that was not before. (`savepoint --drain-in-flight` makes them all equal first: then which records are
  late is exactly as it would have been.)
- sources keep their partitions and offsets: a generator's are pinned to the count it had
  (JobPlan.kept_partitions), as a redis_stream source's are its own;
- assignments keep each chain's parallelism, as even ranges of the new key groups, under a new epoch.

It is recorded as a plan version of its own, whose cut is every source partition's offset at the savepoint,
so the job's history (and the oracle) sees one spec per version. Everything is written in one transaction
after it was all read: a restore that fails half way leaves the savepoint's keys as they were.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from . import generators
from .chaining import chains
from .codec import decode, encode
from .control import ReconfigureRecord
from .exchange import entry_order
from .jobstore import JobStore, RedisJobStore
from .keygroups import Assignment, key_groups_of_columns
from .plan import JobPlan
from .spec import StreamJob
from .statelog import concat, read_changes, read_snapshot, replay, row_key_groups, snapshot_bytes, state_layout
from .watermarks import MIN_WATERMARK

_COVERS_NOTHING = b"0-1"  # a fresh snapshot's covered changelog id: every later entry applies on top


class CannotResplit(ValueError):
    """The savepoint's job cannot be split again as it is; the message says what is in the way."""


@dataclass(frozen=True)
class _Stream:
    """The records of one edge between chains, per key group: written by `tail`'s workers, read by `consumer`'s."""

    tail: str
    consumer: str


def _streams(plan: JobPlan) -> list[_Stream]:
    return [_Stream(c.tail, consumer.name) for c in chains(plan.spec) for consumer in plan.spec.consumers(c.tail)]


def _generators(plan: JobPlan) -> list[str]:
    return [s.name for s in plan.spec.sources if s.type != "redis_stream"]


def in_flight(store: RedisJobStore, plan: JobPlan) -> list[str]:
    """What the job holds besides state and watermarks: records produced into an edge and not consumed yet, a
    generator whose partitions are not at one global index. Empty once a paused job has drained."""
    found = []
    for op in _generators(plan):
        if _frontier(store, plan, op) is None:
            found.append(f"source '{op}': its partitions have not read up to one global index")
    for s in _streams(plan):
        lag = store.key_group_lag([s.tail], s.consumer, range(plan.key_groups(s.consumer)))
        waiting = sum(n for n in lag.values() if n > 0)
        if waiting:
            found.append(f"{waiting} records from '{s.tail}' not processed by '{s.consumer}' yet")
    return found


def _frontier(store: RedisJobStore, plan: JobPlan, op: str) -> int | None:
    """The global index below which a generator read every record and from which none, if there is one."""
    count = plan.key_groups(op)
    cursors = {p: int(progress.cursor) if progress else 0 for p, (progress, _) in store.partitions(op, range(count)).items()}
    frontier = min(cursor * count + p for p, cursor in cursors.items())
    if all(cursor == generators.local_count(p, count, frontier) for p, cursor in cursors.items()):
        return frontier
    return None


def resplit(store: RedisJobStore, max_parallelism: int) -> JobPlan:
    """Split the job's key groups again under `max_parallelism`, in one transaction; return the plan version
    it runs from now. Raises CannotResplit, naming what is in the way, and then changes nothing."""
    started = time.monotonic()
    previous = store.plan()
    plan = _under(previous, max_parallelism)
    assignments = _assignments(store, previous, plan)
    keys, old = previous.keys, previous.spec.max_parallelism
    pipe = store.transaction()
    for stage in previous.spec.stages:
        layout = state_layout(stage)
        if layout is not None:
            rows = state_rows(store, stage.name, old, layout)
            store.replace_state(pipe, stage.name, old, _snapshots(stage, rows, max_parallelism), _COVERS_NOTHING)
    heard = {}
    for s in _streams(previous):
        progress = store.streams(s.consumer, [keys.kg_stream(s.tail, s.consumer, kg) for kg in range(old)])
        mark = min((m for _, runs in progress for _, _, m in (runs or ((0, 0, MIN_WATERMARK),))),
                   default=MIN_WATERMARK)
        width = plan.key_groups(s.tail)
        news = [keys.kg_stream(s.tail, s.consumer, kg) for kg in range(max_parallelism)]
        heard.setdefault(s.consumer, {}).update({name: [(0, width - 1, mark)] for name in news})
        records = _unread(store, s, [cursor for cursor, _ in progress])
        edge = next(e for e in plan.edges_in(s.consumer) if e.upstream == s.tail)
        store.replace_records(pipe, s.tail, s.consumer, old, {
            kg: (encode(part, mark, [(0, width - 1)]), part.num_rows)
            for kg, part in _routed(records, edge.key_by, max_parallelism)})
    for source in previous.spec.sources:
        progress = store.partitions(source.name, range(previous.key_groups(source.name)))
        store.record_cut(pipe, source.name, plan.version, {p: (step.cursor if step else 0) for p, (step, _) in
                                                           progress.items()})
    change = f"spec.maxParallelism: {old} -> {max_parallelism} (every key group's state re-split at the restore)"
    store.queue_resplit(pipe, previous, plan, assignments, heard,
                        ReconfigureRecord(plan.version, (change,), duration_s=time.monotonic() - started))
    pipe.execute()
    return plan


def _under(previous: JobPlan, max_parallelism: int) -> JobPlan:
    """The version after `previous`: its spec under `max_parallelism`, its generators' partitions kept."""
    doc = previous.job.model_dump(mode="json", by_alias=True)
    doc["spec"]["maxParallelism"] = max_parallelism
    try:
        job = StreamJob.model_validate(doc)
    except ValueError as exc:
        raise CannotResplit(f"the savepoint's spec does not hold under maxParallelism {max_parallelism}: {exc}") from None
    kept = tuple((op, previous.key_groups(op)) for op in _generators(previous))
    return JobPlan(job, previous.t0_ms, previous.version + 1, kept_partitions=kept)


def _assignments(store: RedisJobStore, previous: JobPlan, plan: JobPlan) -> dict[str, Assignment]:
    """Every chain's parallelism as it runs, over even ranges of its new key groups, under a new epoch: every key
    group has a new meaning, and nothing committed under the old one may land."""
    out = {}
    for head in previous.vertices:
        current = store.assignment(head) or previous.initial_assignment(head)
        if current.parallelism > plan.key_groups(head):
            raise CannotResplit(f"'{head}' runs {current.parallelism} instances, more than the "
                                f"{plan.key_groups(head)} key groups maxParallelism {plan.spec.max_parallelism} "
                                "gives it: rescale it first")
        out[head] = Assignment.ranges(current.parallelism, plan.key_groups(head), current.epoch + 1)
    return out


def _unread(store: RedisJobStore, s: _Stream, cursors: list[bytes | None]) -> pa.Table | None:
    """The records written into the edge's streams after their consumer's cursors (heartbeats carry none)."""
    tables = []
    for name, entries in store.unread(s.tail, s.consumer, cursors):
        for entry_id, fields in entries:
            entry = decode(fields)
            if entry.marker is not None or entry.barrier is not None:
                raise CannotResplit(f"{name} holds a rescale's marker or a reconfiguration's barrier (entry "
                                    f"{entry_id.decode()}): a savepoint is taken between changes")
            tables.append(entry.table)
    return concat(tables)


def _routed(records: pa.Table | None, key_by: tuple[str, ...] | None, max_parallelism: int):
    """(key group, records) as a producer routes them under `max_parallelism` (outputs.py): by key, or spread."""
    if records is None:
        return []
    if key_by is None:
        size = -(-records.num_rows // max_parallelism)
        return [(kg, records.slice(kg * size, size)) for kg in range(max_parallelism) if kg * size < records.num_rows]
    kgs = key_groups_of_columns(records, key_by, max_parallelism)
    return [(kg, records.filter(pa.array(kgs == kg))) for kg in np.unique(kgs).tolist()]


def state_rows(store: JobStore, op: str, key_groups: int, layout) -> pa.Table | None:
    """Every row of a stage's state: each key group's snapshot with its changelog after it."""
    tables = []
    for snapshot, entries in store.state_logs(op, key_groups):
        covered, rows = read_snapshot(snapshot) if snapshot is not None else (None, None)
        for entry_id, fields in entries:
            if covered is None or entry_order(entry_id) > entry_order(covered):
                rows = replay(rows, read_changes(fields), layout)
        tables.append(rows)
    return concat(tables)


def _snapshots(spec, rows: pa.Table | None, max_parallelism: int) -> dict[int, bytes]:
    """A stage's rows as one snapshot per key group of theirs under `max_parallelism`."""
    if rows is None:
        return {}
    kgs = row_key_groups(spec, rows, max_parallelism)
    order = np.argsort(kgs, kind="stable")
    rows, kgs = rows.take(pa.array(order)), kgs[order]
    starts = np.flatnonzero(np.r_[True, kgs[1:] != kgs[:-1]])
    return {int(kgs[start]): snapshot_bytes(rows.slice(start, end - start), _COVERS_NOTHING)
            for start, end in zip(starts, np.r_[starts[1:], len(kgs)])}
