"""Source operators: deterministic generators and external Redis input streams.

A source instance owns partitions (its key groups); its progress is the next
offset of each partition, committed with the batch it produced, so a restarted
source resumes exactly where the last commit left off, and an instance that
takes a partition over from another resumes where that one's last commit did.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import redis
from streamjobs_core import generators, shedding
from streamjobs_core.generators import MAX_WATERMARK
from streamjobs_core.plan import JobPlan
from streamjobs_core.spec import RedisStreamSource

from .inputs import MIN_WATERMARK
from .transaction import Transaction


def with_ingest_time(table: pa.Table, now_ms: int) -> pa.Table:
    return table.append_column("_ingest_ms", pa.array(np.full(table.num_rows, now_ms, dtype=np.int64)))


class _PartitionedSource:
    """Partition ownership: restored, taken over and released with the progress committed per partition."""

    _r: redis.Redis
    _plan: JobPlan
    _op: str
    _partitions: tuple[int, ...]

    def restore(self) -> None:
        self.acquire(self._partitions)

    def acquire(self, partitions) -> None:
        """Own these partitions (too), from their committed progress."""
        partitions = tuple(partitions)
        if not partitions:
            return
        self._partitions = tuple(sorted({*self._partitions, *partitions}))
        keys, fields = self._plan.keys, [f"p{p}" for p in partitions]
        offsets = self._r.hmget(keys.offsets(self._op), fields)
        marks = self._r.hmget(keys.watermarks(self._op), fields)
        for p, offset, mark in zip(partitions, offsets, marks):
            self._resume(p, offset, mark)

    def release(self, partition: int) -> None:
        """Stop reading a partition whose progress was committed; another instance takes it over."""
        self._partitions = tuple(p for p in self._partitions if p != partition)
        self._forget(partition)

    def _resume(self, partition: int, offset: bytes | None, mark: bytes | None) -> None:
        raise NotImplementedError

    def _forget(self, partition: int) -> None:
        raise NotImplementedError


class GeneratorSource(_PartitionedSource):
    def __init__(self, r: redis.Redis, plan: JobPlan, op: str, partitions: tuple[int, ...]) -> None:
        self._r = r
        self._plan = plan
        self._op = op
        self._spec = plan.spec.operator(op)
        self._count = plan.key_groups(op)
        self._partitions = tuple(partitions)
        self._next = {p: 0 for p in partitions}
        self._moved: set[int] = set()
        self._stopped = False
        self.behind = False  # the last poll left due records for the next one
        self.pending = 0  # records due and not yet emitted: the autoscaler's view of the source's backlog
        self.bad: list[tuple[str, bytes, str, dict]] = []  # generated records are never undecodable
        self.ranges: shedding.Ranges = []  # the last poll's records: what a shed log entry names

    def _resume(self, partition: int, offset: bytes | None, mark: bytes | None) -> None:
        self._next[partition] = 0 if offset is None else int(offset)  # the watermark follows from the offsets

    def _forget(self, partition: int) -> None:
        del self._next[partition]

    def poll(self, budget: int, now: float, stop_requested: bool) -> tuple[pa.Table | None, int]:
        """Records due by now (at most budget) and the watermark after them."""
        self._stopped |= stop_requested
        elapsed = now - self._plan.t0_ms / 1000
        parts = []
        self.ranges = []
        self.behind = False
        self.pending = 0
        if not self._stopped:
            share = max(1, budget // max(1, len(self._partitions)))
            due_global = generators.due_count(self._spec, elapsed)
            for p in self._partitions:
                due = generators.local_count(p, self._count, due_global)
                end = min(due, self._next[p] + share)
                self.behind |= end < due
                self.pending += due - end
                if end > self._next[p]:
                    parts.append(generators.global_indices(p, self._count, self._next[p], end))
                    self.ranges.append((p, self._next[p], end))
                    self._next[p] = end
                    self._moved.add(p)
        table = None
        if parts:
            table = with_ingest_time(
                generators.generate(self._spec, self._plan.t0_ms, np.concatenate(parts)), int(now * 1000)
            )
        return table, self.watermark()

    def watermark(self) -> int:
        if self._stopped:
            return MAX_WATERMARK
        if not self._partitions:
            return MIN_WATERMARK  # owns nothing (yet): speaks for nothing
        # Event times grow with the global index, so the partition furthest behind bounds them all.
        behind = min(self._next[p] * self._count + p for p in self._partitions)
        return generators.watermark(self._spec, self._plan.t0_ms, behind)

    def shed_ids(self, mask: np.ndarray) -> list[tuple[int, bytes]]:
        return []  # the oracle regenerates what was shed from the logged ranges

    def stage(self, txn: Transaction) -> None:
        if self._moved:
            txn.hset(self._plan.keys.offsets(self._op), {f"p{p}": self._next[p] for p in self._moved})
            self._moved.clear()

    @property
    def finished(self) -> bool:
        return self.watermark() == MAX_WATERMARK


class RedisInputSource(_PartitionedSource):
    """Records XADDed by external producers, one field per column, all strings.

    Event time comes from `eventTimeField` (ms) or the ingest time; a partition's
    watermark is the largest event time it delivered minus outOfOrderMs.
    """

    def __init__(self, r: redis.Redis, plan: JobPlan, op: str, partitions: tuple[int, ...]) -> None:
        self._r = r
        self._plan = plan
        self._op = op
        self._spec: RedisStreamSource = plan.spec.operator(op)
        self._partitions = tuple(partitions)
        self._cursor = {p: b"0-0" for p in partitions}
        self._marks = {p: MIN_WATERMARK for p in partitions}
        # Entries consumed per partition since the stream began, committed with the cursor: with Redis's
        # count of entries ever added it gives the backlog without reading ahead.
        self._consumed = {p: 0 for p in partitions}
        self.bad: list[tuple[str, bytes, str, dict]] = []
        self._stopped = False
        self.behind = False
        self.pending = 0  # measured only for load shedding, and only when a read came back full
        self.ranges: shedding.Ranges = []  # (partition, ms, seq) of each partition's first entry: a seed
        self._ids: list[tuple[int, bytes]] = []  # (partition, entry ID) of each row of the last poll

    def _resume(self, partition: int, offset: bytes | None, mark: bytes | None) -> None:
        self._cursor[partition] = b"0-0" if offset is None else offset
        self._marks[partition] = MIN_WATERMARK if mark is None else int(mark)
        self._consumed[partition] = int(self._r.hget(self._plan.keys.offsets(self._op), f"n{partition}") or 0)

    def _forget(self, partition: int) -> None:
        del self._cursor[partition], self._marks[partition], self._consumed[partition]

    def shed_ids(self, mask: np.ndarray) -> list[tuple[int, bytes]]:
        return [self._ids[i] for i in np.flatnonzero(mask)]

    def poll(self, budget: int, now: float, stop_requested: bool) -> tuple[pa.Table | None, int]:
        self._stopped |= stop_requested
        if self._stopped:
            return None, MAX_WATERMARK
        if not self._partitions:
            return None, self.watermark()
        keys = self._plan.keys
        streams = {keys.input_stream(self._op, p): self._cursor[p] for p in self._partitions}
        count = max(1, budget // max(1, len(streams)))
        reply = self._r.xread(streams, count=count)
        self.behind = any(len(entries) >= count for _, entries in reply)
        now_ms = int(now * 1000)
        rows: list[dict] = []
        times: list[int] = []
        self.ranges, self._ids = [], []
        partition_of = {keys.input_stream(self._op, p): p for p in self._partitions}
        for name, entries in reply:
            stream = name.decode()
            p = partition_of[stream]
            self._consumed[p] += len(entries)
            if entries:
                self.ranges.append((p, *(int(x) for x in entries[0][0].split(b"-"))))
            for entry_id, fields in entries:
                self._cursor[p] = entry_id
                record = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
                event_time = now_ms
                if self._spec.event_time_field:
                    try:
                        event_time = int(record[self._spec.event_time_field])
                    except (KeyError, ValueError) as exc:
                        self.bad.append((stream, entry_id, f"bad event time field: {exc!r}", record))
                        continue
                rows.append(record)
                times.append(event_time)
                self._ids.append((p, entry_id))
                self._marks[p] = max(self._marks[p], event_time - self._spec.out_of_order_ms)
        if not self._spec.event_time_field:
            for p in self._partitions:
                self._marks[p] = max(self._marks[p], now_ms - self._spec.out_of_order_ms)
        self.pending = self._backlog() if self.behind and self._spec.load_shedding else 0
        if not rows:
            return None, self.watermark()
        columns = sorted({k for row in rows for k in row})
        table = pa.table({c: pa.array([row.get(c) for row in rows], pa.string()) for c in columns})
        table = table.append_column("event_time", pa.array(times, pa.int64()))
        return with_ingest_time(table, now_ms), self.watermark()

    def _backlog(self) -> int:
        pipe = self._r.pipeline(transaction=False)
        for p in self._partitions:
            pipe.xinfo_stream(self._plan.keys.input_stream(self._op, p))
        return sum(max(0, info["entries-added"] - self._consumed[p]) for p, info in zip(self._partitions, pipe.execute()))

    def watermark(self) -> int:
        return MAX_WATERMARK if self._stopped else min(self._marks.values(), default=MIN_WATERMARK)

    def stage(self, txn: Transaction) -> None:
        keys = self._plan.keys
        txn.hset(keys.offsets(self._op), {**{f"p{p}": c for p, c in self._cursor.items()},
                                          **{f"n{p}": n for p, n in self._consumed.items()}})
        txn.hset(keys.watermarks(self._op), {f"p{p}": m for p, m in self._marks.items()})

    @property
    def finished(self) -> bool:
        return self._stopped


def make_source(r: redis.Redis, plan: JobPlan, op: str, partitions: tuple[int, ...]):
    spec = plan.spec.operator(op)
    if spec.type == "redis_stream":
        return RedisInputSource(r, plan, op, partitions)
    return GeneratorSource(r, plan, op, partitions)
