"""A worker's input: its source, or its owned kg streams with in-band watermarks.

`Input` is what the worker loop reads batches from; `StreamInput` (here) reads
the kg streams an instance owns, `SourceInput` (source_input.py) polls a source.

Every entry carries its producer's watermark for the producer's key groups
(`runs`). Per stream we keep one watermark per upstream key group; a stream's
watermark is their minimum, and the instance's input watermark the minimum over
its streams. Entries of one stream arrive in order, so a watermark can never
pass data of that stream that was not read yet. Progress is keyed by key
groups, not instances, so it survives any rescale of the upstream.

A handover marker (handover.py) parks its stream: nothing after it is read
here. Once every stream of a key group is parked, the worker releases the key
group with its next commit; the new owner reads on from the marker.

A reconfiguration barrier (reconfigure.py) does not park its stream: several
producers share a stream, and one's barrier may precede another's older
records. Where the change shows (`reconfigure.holds_back`), what a producer
wrote after its barrier goes to the batch's `post` part, with its watermarks
kept apart, until every producer of every owned stream passed the barrier
(`aligned`); the worker then processes the two parts under the two plans in
one commit. Elsewhere it reads through, and switches once the last passed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
from streamjobs_core.codec import DecodeError, decode, header
from streamjobs_core.deadletters import DeadLetter, Kind
from streamjobs_core.exchange import Streams, Transaction
from streamjobs_core.jobstore import JobStore
from streamjobs_core.plan import Edge, JobPlan
from streamjobs_core.spec import BatchingSettings
from streamjobs_core.watermarks import MIN_WATERMARK, runs_of

from . import phases
from .metrics import WorkerMetrics
from .ports import Ports

if TYPE_CHECKING:
    from .pacing import Pacing  # which reads batches of this module

_MAX_ENTRIES_PER_STREAM = 4096


@dataclass
class _Stream:
    key: str
    edge: Edge
    kg: int
    cursor: bytes
    upstream_watermarks: np.ndarray
    passed: np.ndarray  # per upstream key group: the last plan version whose barrier it passed
    read_records: int = 0  # since the last commit
    post_records: int = 0  # of those, written after their producers' reconfiguration barriers
    changed: bool = False
    marker: int | None = None  # parked at a handover marker naming this new owner
    post_watermarks: np.ndarray | None = None  # advanced by what producers wrote after their barriers


@dataclass
class InputBatch:
    tables: dict[str, list[pa.Table]] = field(default_factory=dict)
    # Per owned key group, the watermark of its own streams: a key group taken over mid-stream lags the rest.
    watermarks: dict[int, int] = field(default_factory=dict)
    records: int = 0
    entries: int = 0
    bytes: int = 0  # of the entries read (kg streams): the worker keeps a batch under batching.maxBytes
    full: bool = False
    # what could not be read or decoded: dead-lettered with the batch
    bad: list[DeadLetter] = field(default_factory=list)
    watermark: int = MIN_WATERMARK  # the instance's input watermark after this batch
    waited_s: float = 0.0  # time the read spent waiting for records to fall due (idle, not busy)
    post: InputBatch | None = None  # written after their producers' reconfiguration barriers: the next plan's

    def table(self, upstream: str) -> pa.Table | None:
        parts = self.tables.get(upstream)
        return pa.concat_tables(parts, promote_options="permissive") if parts else None

    def absorb(self, later: InputBatch) -> None:
        """Add a later read of the same input: the batch then covers both (nothing was processed between)."""
        for upstream, parts in later.tables.items():
            self.tables.setdefault(upstream, []).extend(parts)
        self.watermarks = later.watermarks
        self.records += later.records
        self.entries += later.entries
        self.bytes += later.bytes
        self.full = later.full
        self.bad.extend(later.bad)
        self.watermark = later.watermark
        if later.post is not None:
            if self.post is None:
                self.post = InputBatch()
            for upstream, parts in later.post.tables.items():
                self.post.tables.setdefault(upstream, []).extend(parts)
            self.post.records += later.post.records
            self.post.entries += later.post.entries


class Input(Protocol):
    """Where a worker's batches come from. Progress (offsets, watermarks) goes into the batch's commit."""

    def restore(self) -> None:
        """Resume from the committed progress of the owned key groups (or source partitions)."""

    def read(self, block_ms: int) -> InputBatch:
        """What arrived since the last read, as much as the input's batch size; waits up to block_ms when
        nothing did."""

    def wait_ms(self, pacing: Pacing, pending: InputBatch | None, now: float) -> int:
        """How long the next read may block, `pending` read before and not run yet (pacing.py)."""

    def due(self, pacing: Pacing, batch: InputBatch, releasing: bool, now: float) -> bool:
        """Whether the batch read so far runs now, `releasing` when its commit hands key groups over or switches
        plans (pacing.py)."""

    def adapt(self, batch: InputBatch, busy_s: float, batching: BatchingSettings) -> None:
        """Size the next reads after a batch that kept the worker busy busy_s."""

    def add_progress(self, txn: Transaction) -> None:
        """Put the progress of what was read into the transaction that commits its batch."""

    def acquire(self, kgs) -> None:
        """Read these key groups (source partitions) too, from their last owner's commit."""

    def release(self, kg: int) -> None:
        """Stop reading a key group whose progress was committed with its release."""

    def handovers(self) -> dict[int, int]:
        """Key groups to release at the next commit because their markers were reached, with the new owner."""

    def key_group_watermarks(self) -> dict[int, int]:
        """The input watermark of every owned key group."""

    def positions(self) -> dict[str, bytes]:
        """Per input stream (or source partition): where the next read starts (quarantine.py's position)."""

    def read_one(self, stream: str) -> InputBatch:
        """The next entry of that stream alone (a worker isolating the entries it died at)."""

    def skip(self, stream: str, entry_id: bytes) -> dict:
        """Step past the stream's next entry, `entry_id`, unprocessed (it is quarantined; the next commit records
        it as consumed); its fields, for the dead letter."""

    isolates: bool  # whether read_one and skip work: entries of streams (a generator has none)
    version: int  # the plan version the instance runs
    aligning_since: float | None  # when the first barrier of the next plan version was read
    holding: bool  # whether what producers wrote after their barriers is held back until every one passed

    def aligned(self) -> int | None:
        """The plan version to switch to with the next commit, if the instance is due to (reconfigure.py)."""

    def switch(self, plan: JobPlan, txn: Transaction) -> None:
        """The instance runs `plan` from now."""

    def offsets(self) -> dict[int, int | bytes]:
        """Per owned source partition, where the next commit leaves it (a reconfiguration's cut); streams of
        upstream operators have none: their consumers' progress is in the commit."""

    def records_read(self) -> dict[int, int]:
        """Per owned key group, the records read from upstream operators (a control event's sync point)."""

    def lag(self) -> dict[tuple[str, int], int]:
        """Records produced into each owned stream and not yet consumed, per (upstream, kg)."""


def open_input(ports: Ports, plan: JobPlan, op: str, instance: int, owned: tuple[int, ...], metrics: WorkerMetrics,
               holds: Callable[[int], bool]) -> Input:
    """The input of a chain headed by `op`: its source, or the kg streams of its owned key groups."""
    if plan.spec.operator(op) not in plan.spec.sources:
        return StreamInput(ports.exchange, ports.jobs, plan, op, instance, owned, holds)
    from .source_input import SourceInput  # imported here: it builds on this module's InputBatch

    return SourceInput(ports.redis, ports.jobs, plan, op, owned, metrics)


class StreamInput:
    isolates = True

    def __init__(self, exchange: Streams, store: JobStore, plan: JobPlan, op: str, instance: int,
                 owned: tuple[int, ...], holds: Callable[[int], bool] = lambda version: True) -> None:
        self._exchange = exchange
        self._jobs = store
        self._entries_per_stream = 1  # per stream and read: adapt() grows it under backlog
        self._plan = plan
        self._op = op
        self._instance = instance
        self._holds = holds  # whether the switch to a version must hold back what follows its barriers
        self.version = plan.version  # the plan this instance runs
        self.aligning_since: float | None = None  # when the first barrier of the next version was read
        self.holding = False
        self._streams: dict[str, _Stream] = {}
        self._add(owned)

    def _add(self, kgs) -> list[str]:
        added = []
        for edge in self._plan.edges_in(self._op):
            width = self._plan.key_groups(edge.upstream)
            for kg in kgs:
                key = self._plan.keys.kg_stream(edge.upstream, self._op, kg)
                self._streams[key] = _Stream(key, edge, kg, b"0-0", np.full(width, MIN_WATERMARK, dtype=np.int64),
                                             np.full(width, self.version, dtype=np.int64))
                added.append(key)
        return added

    def restore(self) -> None:
        """Resume from the committed offsets and watermark progress."""
        self._load(list(self._streams))

    def acquire(self, kgs) -> None:
        """Read these key groups' streams too, from where their last owner committed (a marker)."""
        self._load(self._add(kgs))

    def release(self, kg: int) -> None:
        for name in [n for n, s in self._streams.items() if s.kg == kg]:
            del self._streams[name]

    def handovers(self) -> dict[int, int]:
        """Key groups whose every stream is parked at a marker, and the new owner the markers name."""
        markers: dict[int, list[int | None]] = {}
        for s in self._streams.values():
            markers.setdefault(s.kg, []).append(s.marker)
        return {kg: found[0] for kg, found in markers.items() if None not in found}

    def aligned(self) -> int | None:
        """The next plan version, once every producer of every owned stream passed its barrier."""
        if not self._streams or self.aligning_since is None:
            return None
        if all(int(s.passed.min()) > self.version for s in self._streams.values()):
            return self.version + 1
        return None

    def switch(self, plan: JobPlan, txn: Transaction) -> None:
        """The instance runs `plan` from now: what producers wrote after their barriers is ordinary input."""
        for s in self._streams.values():
            if s.post_watermarks is not None:
                np.maximum(s.upstream_watermarks, s.post_watermarks, out=s.upstream_watermarks)
                s.post_watermarks = None
            s.post_records = 0
        self.version = plan.version
        self.aligning_since = None
        self.holding = False
        if plan.edges_in(self._op) != self._plan.edges_in(self._op):
            self._rewire(plan, txn)
        self._plan = plan

    def _rewire(self, plan: JobPlan, txn: Transaction) -> None:
        """The instance's producers changed live (a member added to or removed from a producing chain's end,
        a chain added or removed upstream). Every producer of the old streams passed its barrier, after
        which it writes only to its streams under `plan`: the old streams end here and go in this commit,
        and the new ones are read from their start. A chain that goes on writing under another tail keeps
        its watermarks; a new producer starts from none, which a stage never steps back from."""
        owned = sorted({s.kg for s in self._streams.values()})
        by_producer = {(self._plan.head(s.edge.upstream), s.kg): s for s in self._streams.values()}
        wanted = set()
        for edge in plan.edges_in(self._op):
            head, width = plan.head(edge.upstream), plan.key_groups(edge.upstream)
            for kg in owned:
                key = plan.keys.kg_stream(edge.upstream, self._op, kg)
                wanted.add(key)
                if key in self._streams:
                    self._streams[key].edge = edge
                    continue
                old = by_producer.get((head, kg))
                marks = np.full(width, MIN_WATERMARK, dtype=np.int64) if old is None else old.upstream_watermarks
                passed = np.full(width, plan.version, dtype=np.int64) if old is None else old.passed
                self._streams[key] = _Stream(key, edge, kg, b"0-0", marks, passed, changed=True)
        gone = [name for name in self._streams if name not in wanted]
        for name in gone:
            self._count_read(self._streams.pop(name), txn)
        self._jobs.forget_streams(txn, self._op, gone)

    def _load(self, names: list[str]) -> None:
        if not names:
            return
        for name, (offset, marks) in zip(names, self._jobs.streams(self._op, names)):
            stream = self._streams[name]
            if offset is not None:
                stream.cursor = offset
            for lo, hi, mark in marks or ():
                stream.upstream_watermarks[lo : hi + 1] = mark
        # A stream committed at a marker (its key group's other streams not there yet when the worker
        # stopped) stays parked: what follows the marker is the new owner's.
        at_cursors = self._exchange.at({name: self._streams[name].cursor for name in names})
        for name, fields in at_cursors.items():
            marker = None if fields is None else _marker(fields)
            if marker is not None and marker != self._instance:
                self._streams[name].marker = marker

    def wait_ms(self, pacing: Pacing, pending: InputBatch | None, now: float) -> int:
        # Holding back for barriers, the batch is due when they arrive, not by time.
        return pacing.wait_ms(None if self.holding else pending, now)

    def due(self, pacing: Pacing, batch: InputBatch, releasing: bool, now: float) -> bool:
        return pacing.due(batch, releasing, now)

    def adapt(self, batch: InputBatch, busy_s: float, batching: BatchingSettings) -> None:
        # Under backlog a bigger batch costs little more than a small one (Spark's fixed cost dominates), so
        # grow while the batch stays within a few targets and half maxBytes; shrink when a batch is both long
        # and over maxRecords, or over maxBytes.
        target = batching.target_batch_ms / 1000
        if batch.bytes > batching.max_bytes or (busy_s > 3 * target and batch.records > batching.max_records):
            self._entries_per_stream = max(1, self._entries_per_stream // 2)
        elif batch.full and busy_s < 3 * target and batch.bytes < batching.max_bytes // 2:
            self._entries_per_stream = min(_MAX_ENTRIES_PER_STREAM, self._entries_per_stream * 2)

    def read(self, block_ms: int, count: int | None = None) -> InputBatch:
        """Up to `count` entries per stream (by default as many as adapt() settled on); blocks until an entry
        arrives on any of them or block_ms pass.

        The blocking wait is idle time (`waited_s`). Redis answers a blocked XREAD with the stream that
        woke it only (before 7.2): the other streams are read at once after it, or a producer's commit to
        all of them would be seen in parts, and windows would fire key group by key group, a batch apart.
        """
        count = count or self._entries_per_stream
        batch = InputBatch()
        cursors = {name: s.cursor for name, s in self._streams.items() if s.marker is None}
        started = time.monotonic()
        if not cursors:
            if block_ms:
                time.sleep(block_ms / 1000)  # owns nothing (yet), or waits for its release: no busy loop
                batch.waited_s = time.monotonic() - started
        else:
            answered = self._read_once(cursors, count, block_ms, batch)
            # A full reply found its entries waiting (a backlog): it did not block.
            batch.waited_s = 0.0 if batch.full else time.monotonic() - started
            rest = {name: cursor for name, cursor in cursors.items() if name not in answered}
            if answered and rest and block_ms:
                self._read_once(rest, count, 0, batch)
        batch.watermarks = self.key_group_watermarks()
        # The instance's: one that owns nothing (yet) speaks for nothing.
        batch.watermark = min(batch.watermarks.values(), default=MIN_WATERMARK)
        return batch

    def positions(self) -> dict[str, bytes]:
        return {name: s.cursor for name, s in self._streams.items()}

    def read_one(self, stream: str) -> InputBatch:
        batch = InputBatch()
        s = self._streams.get(stream)
        if s is not None and s.marker is None:
            self._read_once({stream: s.cursor}, 1, 0, batch)
        batch.watermarks = self.key_group_watermarks()
        batch.watermark = min(batch.watermarks.values(), default=MIN_WATERMARK)
        return batch

    def skip(self, stream: str, entry_id: bytes) -> dict:
        s = self._streams[stream]
        shown: dict = {"upstream": s.edge.upstream}
        fields = self._exchange.at({stream: entry_id})[stream]
        try:  # its producer's watermark still holds, and its records count as consumed (and dead-lettered)
            if fields is not None:
                records, watermark, runs = header(fields)
                for lo, hi in runs:
                    view = s.upstream_watermarks[lo : hi + 1]
                    np.maximum(view, watermark, out=view)
                s.read_records += records
                shown.update(records=records, payload_bytes=len(fields.get(b"d", b"")))
        except DecodeError as exc:
            shown["header"] = str(exc)
        s.cursor = entry_id
        s.changed = True
        return shown

    def _read_once(self, cursors: dict[str, bytes], count: int, block_ms: int, batch: InputBatch) -> set[str]:
        """Add one XREAD's entries to the batch; the streams it returned entries of."""
        with phases.phase("read"):
            reply = self._exchange.read(cursors, count, block_ms)
        answered = set()
        with phases.phase("decode"):
            for name, entries in reply:
                answered.add(name)
                batch.full |= len(entries) >= count
                self._take(self._streams[name], entries, batch)
        return answered

    def _take(self, stream: _Stream, entries, batch: InputBatch) -> None:
        for entry_id, fields in entries:
            stream.cursor = entry_id
            stream.changed = True
            batch.entries += 1
            batch.bytes += sum(map(len, fields.values()))
            try:
                entry = decode(fields)
            except DecodeError as exc:
                batch.bad.append(DeadLetter.of(self._op, Kind.UNDECODABLE, str(exc), None, stream.key, entry_id))
                continue
            if entry.marker is not None:
                if entry.marker != self._instance:  # one naming this instance is a resumed controller's repeat
                    stream.marker = entry.marker
                    return  # what follows belongs to the new owner
                continue
            if entry.barrier is not None:
                self._pass(stream, entry)
                continue
            part, marks = batch, stream.upstream_watermarks
            # Only once a barrier of the next version was read can an entry follow one (the usual case skips it).
            if self.holding and entry.runs and all(
                    stream.passed[lo : hi + 1].min() > self.version for lo, hi in entry.runs):
                part, marks = self._after_barrier(stream, batch)
            for lo, hi in entry.runs:
                view = marks[lo : hi + 1]
                np.maximum(view, entry.watermark, out=view)
            if entry.table is not None and entry.table.num_rows:
                part.tables.setdefault(stream.edge.upstream, []).append(entry.table)
                part.records += entry.table.num_rows
                stream.read_records += entry.table.num_rows
                if part is not batch:
                    stream.post_records += entry.table.num_rows

    def _pass(self, stream: _Stream, entry) -> None:
        if entry.barrier <= self.version:
            return  # met again after a restart: this instance switched past it
        if self.aligning_since is None:
            self.aligning_since = time.monotonic()
            self.holding = self._holds(entry.barrier)
        for lo, hi in entry.runs:
            view = stream.passed[lo : hi + 1]
            np.maximum(view, entry.barrier, out=view)

    @staticmethod
    def _after_barrier(stream: _Stream, batch: InputBatch) -> tuple[InputBatch, np.ndarray]:
        if batch.post is None:
            batch.post = InputBatch()
        if stream.post_watermarks is None:
            stream.post_watermarks = stream.upstream_watermarks.copy()
        return batch.post, stream.post_watermarks

    def key_group_watermarks(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self._streams.values():
            mark = int(s.upstream_watermarks.min())
            out[s.kg] = min(out.get(s.kg, mark), mark)
        return out

    def add_progress(self, txn: Transaction) -> None:
        """Add the offsets, watermark progress and trims of what was read to the transaction."""
        changed = [s for s in self._streams.values() if s.changed]
        self._jobs.record_streams(txn, self._op, {s.key: (s.cursor, runs_of(s.upstream_watermarks)) for s in changed})
        for stream in changed:
            txn.trims[stream.key] = stream.cursor  # consumed entries go; one stream, one consumer
            self._count_read(stream, txn)
            stream.changed = False

    def _count_read(self, stream: _Stream, txn: Transaction) -> None:
        if stream.read_records:
            edge = stream.edge
            txn.hincrby(self._plan.keys.consumed(edge.upstream, edge.downstream), str(stream.kg), stream.read_records)
            stream.read_records = 0

    def offsets(self) -> dict[int, int | bytes]:
        return {}

    def records_read(self) -> dict[int, int]:
        """Per owned key group: the records read from its streams so far, committed or in the batch's part
        before the reconfiguration barriers (what a control event's sync point has seen)."""
        upstreams = [e.upstream for e in self._plan.edges_in(self._op)]
        out = self._jobs.consumed(upstreams, self._op, sorted({s.kg for s in self._streams.values()}))
        for s in self._streams.values():
            out[s.kg] += s.read_records - s.post_records
        return out

    def lag(self) -> dict[tuple[str, int], int]:
        """Records produced into each owned stream and not yet consumed, per (upstream, kg)."""
        owned = sorted({s.kg for s in self._streams.values()})  # every input edge has a stream per owned kg
        return self._jobs.key_group_lag([e.upstream for e in self._plan.edges_in(self._op)], self._op, owned)


def _marker(fields: dict[bytes, bytes]) -> int | None:
    try:
        return decode(fields).marker
    except DecodeError:
        return None
