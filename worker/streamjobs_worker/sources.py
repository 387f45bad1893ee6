"""Source operators: deterministic generators and external Redis input streams.

A source instance owns partitions (its key groups); its progress is the next
offset of each partition, committed with the batch it produced, so a restarted
source resumes exactly where the last commit left off, and an instance that
takes a partition over from another resumes where that one's last commit did.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import pyarrow as pa
import redis
from streamjobs_core import generators, shedding
from streamjobs_core.control import PartitionProgress
from streamjobs_core.deadletters import DeadLetter
from streamjobs_core.exchange import Transaction, next_entry
from streamjobs_core.jobstore import JobStore
from streamjobs_core.plan import JobPlan
from streamjobs_core.spec import RedisStreamSource
from streamjobs_core.watermarks import MAX_WATERMARK, MIN_WATERMARK

from . import external


def with_ingest_time(table: pa.Table, now_ms: int) -> pa.Table:
    return table.append_column("_ingest_ms", pa.array(np.full(table.num_rows, now_ms, dtype=np.int64)))


class _PartitionedSource:
    """Partition ownership: restored, taken over and released with the progress committed per partition."""

    _r: redis.Redis
    _jobs: JobStore
    _plan: JobPlan
    _op: str
    _partitions: tuple[int, ...]

    @property
    def partitions(self) -> tuple[int, ...]:
        return self._partitions

    def restore(self) -> None:
        self.acquire(self._partitions)

    def acquire(self, partitions) -> None:
        """Own these partitions (too), from their committed progress."""
        partitions = tuple(partitions)
        if not partitions:
            return
        self._partitions = tuple(sorted({*self._partitions, *partitions}))
        for p, (progress, mark) in self._jobs.partitions(self._op, partitions).items():
            self._resume(p, progress, mark)

    def release(self, partition: int) -> None:
        """Stop reading a partition whose progress was committed; another instance takes it over."""
        self._partitions = tuple(p for p in self._partitions if p != partition)
        self._forget(partition)

    def _resume(self, partition: int, progress: PartitionProgress | None, mark: int | None) -> None:
        raise NotImplementedError

    def _forget(self, partition: int) -> None:
        raise NotImplementedError


class GeneratorSource(_PartitionedSource):
    def __init__(self, jobs: JobStore, plan: JobPlan, op: str, partitions: tuple[int, ...]) -> None:
        self._jobs = jobs
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
        self.bad: list[DeadLetter] = []  # generated records are never undecodable
        self.ranges: shedding.Ranges = []  # the last poll's records: what a shed log entry names

    def _resume(self, partition: int, progress: PartitionProgress | None, mark: int | None) -> None:
        # The watermark follows from the offsets.
        self._next[partition] = 0 if progress is None else int(progress.cursor)

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

    def add_progress(self, txn: Transaction) -> None:
        self._jobs.record_partitions(txn, self._op, {p: PartitionProgress(self._next[p]) for p in self._moved})
        self._moved.clear()

    def offsets(self) -> dict[int, int]:
        """Per owned partition: the offset it reads on from (what the next commit records)."""
        return {p: self._next[p] for p in self._partitions}

    def positions(self) -> dict[str, bytes]:
        return {f"{self._op}/{p}": b"%d-0" % self._next[p] for p in self._partitions}

    @property
    def finished(self) -> bool:
        return self.watermark() == MAX_WATERMARK


class RedisInputSource(_PartitionedSource):
    """Records that external producers XADD, decoded by format and schema without a step per record
    (external.py); records that do not decode go to `bad`, to be dead-lettered, and the rest go on.

    A partition's progress is its cursor (the last entry consumed), committed with three counts: records
    consumed (n), its position, i.e. the entries its stream had up to the cursor, trimmed ones included (e),
    whose difference from Redis's count of entries ever added is the backlog, and the position this run
    started from (s), so that the oracle knows how many entries the run consumed. Event time is
    `eventTimeField` or the entry ID's time; a partition's watermark is the largest event time it delivered
    minus outOfOrderMs and, without an event time field, also follows Redis's clock once a read found no
    more entries (a later entry's ID cannot be older). Consumed entries are trimmed in a commit as the
    source's `retention` says; input not consumed yet never is.
    """

    def __init__(self, r: redis.Redis, jobs: JobStore, plan: JobPlan, op: str, partitions: tuple[int, ...]) -> None:
        self._r = r
        self._jobs = jobs
        self._plan = plan
        self._op = op
        self._spec: RedisStreamSource = plan.spec.operator(op)
        self._decoder = external.Decoder(self._spec)
        self._reader = external.StreamReader(r, self._spec.limits.max_entry_bytes, plan.spec.batching.max_bytes)
        self._streams = {p: plan.keys.input_stream(op, p) for p in range(self._spec.partitions)}
        self._partition_of = {name.encode(): p for p, name in self._streams.items()}
        self._partitions = tuple(partitions)
        self._cursor: dict[int, bytes] = {}
        self._marks: dict[int, int] = {}
        self._counts: dict[int, _Counts] = {}
        self._kept: dict[int, deque[tuple[int, float, bytes]]] = {}  # retention by time: (bucket, committed, cursor)
        self._moved: set[int] = set()
        self._now = time.time()
        self.bad: list[DeadLetter] = []  # what the last polls could not take, to be dead-lettered
        self._stopped = False
        self.behind = False
        self.pending = 0  # measured only for load shedding, and only when a read came back full
        self.ranges: shedding.Ranges = []  # (partition, ms, seq) of each partition's first entry: a seed
        self._last = _Rows.none()  # where each row of the last poll came from

    def _resume(self, partition: int, progress: PartitionProgress | None, mark: int | None) -> None:
        if progress is None:
            self._cursor[partition] = b"0-0"
            start = self._entries_before(partition)
            self._counts[partition] = _Counts(0, start, start)
            self._kept[partition] = deque()
        else:
            self._cursor[partition] = progress.cursor
            self._counts[partition] = _Counts(progress.records or 0, progress.position or 0, progress.start or 0)
            # What was consumed before the restart is kept as long as if it had been committed now.
            self._kept[partition] = deque([(-1, time.time(), progress.cursor)])
        self._marks[partition] = MIN_WATERMARK if mark is None else mark

    def _entries_before(self, partition: int) -> int:
        """Entries of the stream that a fresh start will never see: those trimmed already."""
        try:
            info = self._r.xinfo_stream(self._streams[partition])
        except redis.ResponseError:  # no stream yet
            return 0
        return max(0, int(info.get("entries-added", info["length"])) - int(info["length"]))

    def _forget(self, partition: int) -> None:
        del self._cursor[partition], self._marks[partition], self._counts[partition], self._kept[partition]
        self._moved.discard(partition)

    def shed_ids(self, mask: np.ndarray) -> list[tuple[int, bytes]]:
        return self._last.ids_of(np.flatnonzero(mask))

    def poll(self, budget: int, now: float, stop_requested: bool, block_ms: int = 0,
             only: int | None = None) -> tuple[pa.Table | None, int]:
        """Records that arrived (at most about budget; an Arrow entry's records come whole) and the watermark
        after them; `block_ms` > 0 waits that long for a first entry. `only`: that partition alone."""
        self._stopped |= stop_requested
        if self._stopped:
            return None, MAX_WATERMARK
        if not self._partitions:
            return None, self.watermark()
        self._now = now
        read_from = self._partitions if only is None else (only,)
        streams = {self._streams[p]: self._cursor[p] for p in read_from}
        count = max(1, budget // len(streams))
        read = self._reader.read(streams, count, block_ms)
        ids: list[bytes] = []
        fields: list = []
        parts: list[int] = []
        sizes: list[int] = []
        full: set[int] = set()
        self.ranges = []
        for name, entries in read.streams:  # per stream; the entries themselves are gathered whole
            if not entries:
                continue
            p = self._partition_of[name if isinstance(name, bytes) else name.encode()]
            self._cursor[p] = entries[-1][0]
            self._counts[p].position += len(entries)
            self._moved.add(p)
            if len(entries) >= count:
                full.add(p)
            self.ranges.append((p, *(int(x) for x in entries[0][0].split(b"-"))))
            ids.extend(map(itemgetter(0), entries))
            fields.extend(map(itemgetter(1), entries))
            parts.append(p)
            sizes.append(len(entries))
        if read.cut:  # the byte budget ended the read: no stream may count as read to its end
            full.update(read_from)
        self.behind = bool(full)
        decoded = self._decoder.decode(ids, fields)
        entry_partition = np.repeat(np.array(parts, dtype=np.int64), sizes)
        self._last = _Rows(entry_partition, ids, decoded.entry, decoded.row)
        for bad in decoded.bad:
            p = int(entry_partition[bad.entry])
            self.bad.append(DeadLetter.of(self._op, bad.kind, bad.error, bad.record, self._streams[p], ids[bad.entry],
                                         bad.size))
            self._counts[p].records += 1
        self._advance(decoded, entry_partition, read.server_ms, set(read_from) - full)
        self.pending = 0
        if self.behind and self._spec.load_shedding and ids:
            self.pending = int(self._backlog() * decoded.records / len(ids))
        return decoded.table, self.watermark()

    def _advance(self, decoded: external.Decoded, entry_partition: np.ndarray, server_ms: int,
                 read_to_end: set[int]) -> None:
        """Records consumed and watermarks, per partition; `read_to_end`: the partitions read to their end."""
        ooo = self._spec.out_of_order_ms
        if decoded.table is not None:
            row_partition = entry_partition[decoded.entry]
            starts = np.flatnonzero(np.r_[True, row_partition[1:] != row_partition[:-1]])
            event_time = decoded.table.column("event_time").to_numpy()
            latest = np.maximum.reduceat(event_time, starts)
            rows = np.diff(np.r_[starts, len(row_partition)])
            for p, last, n in zip(row_partition[starts].tolist(), latest.tolist(), rows.tolist()):
                self._counts[p].records += n
                self._marks[p] = max(self._marks[p], last - ooo)
        if self._spec.event_time_field is None:
            # Every entry added before the read's clock reading was read (the read was not full): a later one
            # gets an ID, hence an event time, of that reading or later.
            for p in read_to_end:
                self._marks[p] = max(self._marks[p], server_ms - 1 - ooo)

    def _backlog(self) -> int:
        """Entries added and not consumed yet, all partitions."""
        pipe = self._r.pipeline(transaction=False)
        for p in self._partitions:
            pipe.xinfo_stream(self._streams[p])
        infos = pipe.execute()
        return sum(max(0, info["entries-added"] - self._counts[p].position) for p, info in zip(self._partitions, infos))

    def watermark(self) -> int:
        return MAX_WATERMARK if self._stopped else min(self._marks.values(), default=MIN_WATERMARK)

    def offsets(self) -> dict[int, bytes]:
        """Per owned partition: the last entry read (what the next commit records)."""
        return dict(self._cursor)

    def positions(self) -> dict[str, bytes]:
        return {self._streams[p]: self._cursor[p] for p in self._partitions}

    def partition_of(self, stream: str) -> int:
        return self._partition_of[stream.encode()]

    def skip(self, stream: str, entry_id: bytes) -> dict:
        """Step past the partition's next entry unprocessed (quarantined); its fields, for the dead letter."""
        p = self.partition_of(stream)
        read = self._reader.range({stream: (self._cursor[p], entry_id)}, 1)
        shown: dict = {}
        for _, entries in read.streams:
            for _, fields in entries:
                shown = fields.record() if isinstance(fields, external.Oversize) else external.fields_of(fields)
        self._cursor[p] = entry_id
        self._counts[p].position += 1
        self._counts[p].records += 1
        self._moved.add(p)
        return shown

    def add_progress(self, txn: Transaction) -> None:
        progress = {p: PartitionProgress(self._cursor[p], self._counts[p].records, self._counts[p].position,
                                         self._counts[p].start) for p in self._moved}
        self._jobs.record_partitions(txn, self._op, progress, watermarks=self._marks)
        self._trim(txn)
        self._moved.clear()

    def _trim(self, txn: Transaction) -> None:
        """Trim consumed entries in this commit, per the retention: at once, or once committed `ms` ago."""
        keep_ms = self._spec.retention.keep_ms
        if keep_ms == 0:
            for p in self._moved:
                txn.trims[self._streams[p]] = next_entry(self._cursor[p])
            return
        keep_s = keep_ms / 1000
        bucket = int(self._now * 1000) // max(1, keep_ms // 64)  # at most ~64 cursors remembered
        for p in self._partitions:
            kept = self._kept[p]
            if p in self._moved:
                if kept and kept[-1][0] == bucket:
                    kept.pop()
                kept.append((bucket, self._now, self._cursor[p]))
            trim_to = None
            while kept and self._now - kept[0][1] >= keep_s:
                trim_to = kept.popleft()[2]
            if trim_to is not None:
                txn.trims[self._streams[p]] = next_entry(trim_to)

    @property
    def finished(self) -> bool:
        return self._stopped


@dataclass
class _Counts:
    """A partition's progress beside its cursor (committed as a PartitionProgress)."""

    records: int  # records consumed in this run, bad ones included
    position: int  # entries the stream had up to the cursor, trimmed ones included
    start: int  # the position this run started from


@dataclass(frozen=True)
class _Rows:
    """Where each row of a poll came from: what a shed log entry names."""

    entry_partition: np.ndarray
    ids: list[bytes]
    entry: np.ndarray
    row: np.ndarray | None

    @classmethod
    def none(cls) -> _Rows:
        empty = np.zeros(0, dtype=np.int64)
        return cls(empty, [], empty, None)

    def ids_of(self, rows: np.ndarray) -> list[tuple[int, bytes]]:
        return [(int(self.entry_partition[self.entry[i]]),
                 external.record_id(self.ids[self.entry[i]], None if self.row is None else int(self.row[i])))
                for i in rows.tolist()]


def make_source(r: redis.Redis | None, jobs: JobStore, plan: JobPlan, op: str, partitions: tuple[int, ...]):
    """`r`: the job's Redis, which an external stream is read from; None when the job runs over memory."""
    spec = plan.spec.operator(op)
    if spec.type != "redis_stream":
        return GeneratorSource(jobs, plan, op, partitions)
    if r is None:
        raise ValueError(f"{op}: a redis_stream source reads the job's Redis, and this job runs over memory")
    return RedisInputSource(r, jobs, plan, op, partitions)
