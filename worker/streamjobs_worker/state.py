"""Keyed state partitioned by key group, held as Arrow tables.

A stage's state is rows of one table: the window stage keeps a row per key and
window (its partial aggregates), the stateful stage a row per key. A store
keeps each key group's rows apart, so that a key group can be restored,
snapshotted and handed over on its own, and within a key group splits them by
segment: the window's start (state without windows has one segment). A batch
reads and rewrites only the segments of its own windows, and a window fires by
taking its segments out whole, so the cost of a batch does not grow with state
that lies beside it (windows far ahead, a benchmark's ballast).

Each change is also recorded as pending changelog until the checkpoint drains
it into the batch's transaction: per key group a ChangeSet, columnar like the
state. Redis holds the durable copy (changelog + snapshots, see recovery.py); a
backend holds the working copy: `memory` (the tables themselves, the default:
a table per segment for state laid out by time, whose batches rewrite a segment
for most key groups at once, else a table per key group and segment) or
`rocksdb` (each key group's segment as Arrow IPC bytes in rocksdict, as
quix-streams keeps state in RocksDB: state beyond memory, at the cost of
encoding what a batch touches). The working copy is rebuilt from Redis at every
start, so a backend never needs to survive a restart.
"""

from __future__ import annotations

import bisect
import shutil
import struct
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core.statelog import ChangeSet, StateLayout, concat, from_ipc, to_ipc

KG = "_kg"  # the key group of each row, on the tables a store and its stage exchange
_DELETED, _SEQ = "_deleted", "_seq"


Merge = Callable[[pa.Table | None], tuple[pa.Table | None, pa.Table | None, pa.Table | None]]


def groups_of(values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each distinct value (ascending) with the positions holding it (in their order)."""
    if not len(values):
        return []
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    return [(int(ordered[a]), order[a:b]) for a, b in zip(starts, ends)]


def per_key_group(values: Mapping[int, int], key_groups: int, missing: int) -> np.ndarray:
    """A value per key group as an array indexed by key group (`missing` where none is given): looked up
    for a batch's rows at once, `array[row_key_groups]`."""
    out = np.full(key_groups, missing, dtype=np.int64)
    if values:
        out[np.fromiter(values.keys(), np.int64, len(values))] = np.fromiter(values.values(), np.int64, len(values))
    return out


_ROW_IDS = np.random.default_rng()


def row_ids(n: int) -> pa.Array:
    """Ids for rows a stage keeps apart though their values may be equal (a join's, an over's): random, as
    only committed state is ever restored, so a replayed batch's new ids never meet the ones it replaced."""
    return pa.array(_ROW_IDS.integers(0, 2**63 - 1, n, dtype=np.int64))


def take(table: pa.Table, positions: np.ndarray) -> pa.Table:
    # An Arrow array of positions: Table.take converts a numpy one element by element.
    return table.take(pa.array(positions))


def replace_rows(current: pa.Table | None, upserts: pa.Table | None, deletes: pa.Table | None,
                 key: str) -> pa.Table | None:
    """`current` without the rows whose key is upserted or deleted, then the upserted rows."""
    gone = [t.column(key) for t in (upserts, deletes) if t is not None and t.num_rows]
    if current is not None and gone:
        keys = pa.chunked_array([c.cast(current.schema.field(key).type) for c in gone]).combine_chunks()
        current = current.filter(pc.invert(pc.is_in(current.column(key), value_set=keys, skip_nulls=False)))
    return concat([current, upserts])


def last_per_key(rows: pa.Table, keys: list[str]) -> pa.Table:
    """The last row of every key, in table order."""
    numbered = rows.append_column(_SEQ, pa.array(np.arange(rows.num_rows)))
    return _latest(numbered, keys).drop_columns([_SEQ])


def _latest(rows: pa.Table, keys: list[str]) -> pa.Table:
    last = rows.group_by(keys, use_threads=False).aggregate([(_SEQ, "max")])
    return rows.filter(pc.is_in(rows.column(_SEQ), value_set=last.column(f"{_SEQ}_max")))


class ChangeLog:
    """Changes in the order they happened, folded into one ChangeSet per key group: the last change of a
    row wins, and a cut drops the earlier changes it covers. Bounds of one key group's cuts never fall."""

    def __init__(self) -> None:
        self._parts: list[pa.Table] = []
        self._seen: set[int | None] = set()  # segments changed so far (None: unknown)
        self._overlap = False  # whether one row may have changed twice
        self._cuts: dict[int, tuple[int, int]] = {}  # kg -> (bound, sequence number of the cut)
        self._resets: set[int] = set()  # key groups whose every earlier row is gone
        self._next = 0

    def __bool__(self) -> bool:
        return bool(self._parts or self._cuts or self._resets)

    def holds(self, kg: int) -> bool:
        return kg in self._cuts or kg in self._resets or any(
            pc.any(pc.equal(p.column(KG), kg)).as_py() for p in self._parts)

    def was_reset(self, kg: int) -> bool:
        return kg in self._resets

    def reset(self, kg: int) -> None:
        """Every row of the key group is gone: the changes before are void, those after apply to nothing."""
        self._parts = [kept for p in self._parts if (kept := p.filter(pc.not_equal(p.column(KG), kg))).num_rows]
        self._cuts.pop(kg, None)
        self._resets.add(kg)

    def rows(self, rows: pa.Table, deleted: bool, segment: int | None = None) -> None:
        """Rows (with KG) upserted, or the identity columns (with KG) of rows deleted; `segment` if all share one."""
        if not rows.num_rows:
            return
        self._overlap = self._overlap or segment in self._seen or None in self._seen or (
            segment is None and bool(self._parts))
        self._seen.add(segment)
        n = rows.num_rows
        self._parts.append(rows.append_column(_DELETED, pa.repeat(pa.scalar(deleted), n))
                           .append_column(_SEQ, pa.array(np.arange(self._next, self._next + n))))
        self._next += n

    def cut(self, kg: int, bound: int) -> None:
        previous = self._cuts.get(kg, (bound, 0))[0]
        self._cuts[kg] = (max(previous, bound), self._next)

    def add(self, kg: int, changes: ChangeSet) -> None:
        """Replay a key group's ChangeSet (a changelog entry) after what this log holds."""
        if changes.reset:
            self.reset(kg)
        if changes.cut is not None:
            self.cut(kg, changes.cut)
        for part, deleted in ((changes.deletes, True), (changes.upserts, False)):
            if part is not None:
                self.rows(part.append_column(KG, pa.repeat(pa.scalar(kg, pa.int64()), part.num_rows)), deleted)

    def fold(self, layout: StateLayout | None) -> dict[int, ChangeSet]:
        folded: dict[int, ChangeSet] = {}
        rows = concat(self._parts)
        if rows is not None:
            if layout is None:
                raise RuntimeError("state changes for a store that knows no state layout")
            if self._overlap:
                rows = _latest(rows, [KG, *layout.identity])
            rows = self._uncut(rows, layout)
            # Sorted by key group, upserts before deletes: each key group's ChangeSet is two slices.
            kgs = rows.column(KG).to_numpy()
            deleted = rows.column(_DELETED).to_numpy(zero_copy_only=False)
            order = np.lexsort((deleted, kgs))
            rows, kgs, deleted = take(rows, order).combine_chunks(), kgs[order], deleted[order]
            upserts = rows.drop_columns([KG, _DELETED, _SEQ])
            deletes = rows.select(layout.identity)
            for kg, positions in groups_of(kgs):
                start, end = int(positions[0]), int(positions[-1]) + 1
                split = start + int(np.count_nonzero(~deleted[start:end]))
                folded[kg] = ChangeSet(upserts.slice(start, split - start) if split > start else None,
                                       deletes.slice(split, end - split) if end > split else None,
                                       self._cuts.get(kg, (None,))[0], kg in self._resets)
        for kg, (bound, _) in self._cuts.items():
            folded.setdefault(kg, ChangeSet(cut=bound, reset=kg in self._resets))
        for kg in self._resets:
            folded.setdefault(kg, ChangeSet(reset=True))
        return folded

    def _uncut(self, rows: pa.Table, layout: StateLayout) -> pa.Table:
        """Without the changes a later cut of their key group removed again."""
        if not self._cuts or layout.segment is None:
            return rows
        size = max(max(self._cuts), int(pc.max(rows.column(KG)).as_py())) + 1
        bound = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
        at = np.zeros(size, dtype=np.int64)
        for kg, (value, seq) in self._cuts.items():
            bound[kg], at[kg] = value, seq
        kgs = rows.column(KG).to_numpy()
        covered = (rows.column(layout.segment).to_numpy() <= bound[kgs]) & (rows.column(_SEQ).to_numpy() < at[kgs])
        return rows.filter(pa.array(~covered)) if covered.any() else rows


# --- backends: where the rows of each key group and segment live ------------------------------


class Backend(Protocol):
    """Rows cross a backend with their key group in column KG."""

    def read(self, kgs: Collection[int], segment: int) -> pa.Table | None: ...  # the segment's rows of kgs
    def write(self, segment: int, kgs: Collection[int], rows: pa.Table | None) -> None: ...  # replace them
    def segments(self, kg: int) -> list[int]: ...  # ascending
    def drop(self, kg: int) -> None: ...
    def close(self) -> None: ...


class _PerKeyGroup:
    """A backend that keeps each key group's segment apart (`get` and `put` without KG)."""

    def get(self, kg: int, segment: int) -> pa.Table | None:
        raise NotImplementedError

    def put(self, kg: int, segment: int, rows: pa.Table | None) -> None:  # None (or no rows) removes
        raise NotImplementedError

    def read(self, kgs: Collection[int], segment: int) -> pa.Table | None:
        tables, owners = [], []
        for kg in kgs:
            table = self.get(kg, segment)
            if table is not None:
                tables.append(table)
                owners.append(np.full(table.num_rows, kg, dtype=np.int64))
        rows = concat(tables)
        return None if rows is None else rows.append_column(KG, pa.array(np.concatenate(owners)))

    def write(self, segment: int, kgs: Collection[int], rows: pa.Table | None) -> None:
        written = set()
        if rows is not None and rows.num_rows:
            groups = groups_of(rows.column(KG).to_numpy())
            single = len(groups) == 1
            rows = rows if single else rows.combine_chunks()
            for kg, positions in groups:
                # take, not slice: a slice would keep this batch's whole table alive while any kg holds on to it
                self.put(kg, segment, (rows if single else take(rows, positions)).drop_columns([KG]))
                written.add(kg)
        for kg in kgs:
            if kg not in written:
                self.put(kg, segment, None)


class KeyGroupTables(_PerKeyGroup):
    """Memory, a table per key group and segment: for state whose segments may hold all of it (a stateful
    stage's one segment), where a batch rewrites only the key groups it touches."""

    def __init__(self) -> None:
        self._data: dict[int, dict[int, pa.Table]] = {}

    def get(self, kg: int, segment: int) -> pa.Table | None:
        return self._data.get(kg, {}).get(segment)

    def put(self, kg: int, segment: int, rows: pa.Table | None) -> None:
        if rows is None or not rows.num_rows:
            self._data.get(kg, {}).pop(segment, None)
        else:
            self._data.setdefault(kg, {})[segment] = rows

    def segments(self, kg: int) -> list[int]:
        return sorted(self._data.get(kg, ()))

    def drop(self, kg: int) -> None:
        self._data.pop(kg, None)

    def close(self) -> None:
        self._data.clear()


class SegmentTables:
    """Memory, a table per segment holding the rows of every key group (with KG): for state laid out by
    time, whose batch rewrites a few segments for most key groups. One read and one write per segment and
    batch, where a table per key group took one per key group and segment (a sliding window of 5 panes
    over 128 key groups: 640 splits of every batch's rows)."""

    _MAX_CHUNKS = 8  # rewrites of some key groups append chunks; past this many the segment is made whole

    def __init__(self) -> None:
        self._rows: dict[int, pa.Table] = {}
        self._held: dict[int, set[int]] = {}  # segment -> key groups with rows in it
        self._where: dict[int, set[int]] = {}  # key group -> segments holding its rows

    def read(self, kgs: Collection[int], segment: int) -> pa.Table | None:
        rows = self._rows.get(segment)
        if rows is None:
            return None
        held = self._held[segment]
        wanted = held.intersection(kgs)
        if len(wanted) == len(held):
            return rows
        return rows.filter(_of(rows, wanted)) if wanted else None

    def write(self, segment: int, kgs: Collection[int], rows: pa.Table | None) -> None:
        kgs = set(kgs)
        held = self._held.get(segment, set())
        replaced = held & kgs
        kept = self._rows.get(segment)
        if replaced:
            kept = None if replaced == held else kept.filter(pc.invert(_of(kept, replaced)))
        now = held - kgs
        if rows is not None and rows.num_rows:
            now |= set(np.unique(rows.column(KG).to_numpy()).tolist())
        for kg in held - now:
            self._where[kg].discard(segment)
        for kg in now - held:
            self._where.setdefault(kg, set()).add(segment)
        new = concat([kept, rows])
        if new is None:
            self._rows.pop(segment, None)
            self._held.pop(segment, None)
            return
        self._rows[segment] = new.combine_chunks() if new.column(KG).num_chunks > self._MAX_CHUNKS else new
        self._held[segment] = now

    def segments(self, kg: int) -> list[int]:
        return sorted(self._where.get(kg, ()))

    def drop(self, kg: int) -> None:
        for segment in self.segments(kg):
            self.write(segment, (kg,), None)
        self._where.pop(kg, None)

    def close(self) -> None:
        self._rows.clear()
        self._held.clear()
        self._where.clear()


def _of(rows: pa.Table, kgs: Collection[int]) -> pa.ChunkedArray:
    """Whether each row belongs to one of these key groups."""
    return pc.is_in(rows.column(KG), value_set=pa.array(sorted(kgs), pa.int64()))


def memory_for(layout: StateLayout | None) -> Backend:
    return SegmentTables() if layout is not None and layout.by_time else KeyGroupTables()


class RocksDBBackend(_PerKeyGroup):
    """One RocksDB per worker; a key is the key group (4 bytes) + the segment (8 bytes, ordered), a value
    the segment's rows as Arrow IPC."""

    def __init__(self, path: str) -> None:
        from rocksdict import Options, Rdict

        shutil.rmtree(path, ignore_errors=True)  # the working copy is rebuilt from Redis
        self._path = path
        self._db = Rdict(path, options=Options(raw_mode=True))
        self._segments: dict[int, list[int]] = {}  # per kg, ascending: spares a scan of RocksDB per batch

    @staticmethod
    def _key(kg: int, segment: int) -> bytes:
        return struct.pack(">IQ", kg, segment + 2**63)

    def get(self, kg: int, segment: int) -> pa.Table | None:
        data = self._db.get(self._key(kg, segment))
        return None if data is None else from_ipc(data)

    def put(self, kg: int, segment: int, rows: pa.Table | None) -> None:
        known = self._segments.setdefault(kg, [])
        at = bisect.bisect_left(known, segment)
        present = at < len(known) and known[at] == segment
        if rows is None or not rows.num_rows:
            if present:
                del self._db[self._key(kg, segment)]
                known.pop(at)
            return
        self._db[self._key(kg, segment)] = to_ipc(rows)
        if not present:
            known.insert(at, segment)

    def segments(self, kg: int) -> list[int]:
        return list(self._segments.get(kg, ()))

    def drop(self, kg: int) -> None:
        self._segments.pop(kg, None)
        self._db.delete_range(struct.pack(">I", kg), struct.pack(">I", kg + 1))

    def close(self) -> None:
        self._db.close()
        shutil.rmtree(self._path, ignore_errors=True)


# --- the store ---------------------------------------------------------------------------------


class KeyGroupStore:
    """The state of the key groups an instance owns, with the changes not yet drained.

    A store opened before its stage knows no layout yet; the stage binds it (stateless stages never do,
    and hold no rows). Without a backend given, state lives in memory in the form its layout suits."""

    def __init__(self, key_groups: Iterable[int], backend: Backend | None = None,
                 layout: StateLayout | None = None) -> None:
        self._key_groups = tuple(key_groups)
        self._in_memory = backend is None
        self._backend = backend or memory_for(layout)
        self._layout = layout
        self._pending = ChangeLog()

    @property
    def key_groups(self) -> tuple[int, ...]:
        return self._key_groups

    def close(self) -> None:
        """Let go of the working copy (Redis holds the durable state)."""
        self._backend.close()

    @property
    def layout(self) -> StateLayout | None:
        return self._layout

    def bind(self, layout: StateLayout) -> None:
        if self._layout is not None and self._layout != layout:
            raise ValueError(f"state store holds {self._layout}, not {layout}")
        if self._layout is None and self._in_memory:  # holds no rows yet: none are kept without a layout
            self._backend = memory_for(layout)
        self._layout = layout

    def _check(self, kgs: Iterable[int]) -> None:
        owned = self._key_groups
        for kg in kgs:
            if kg not in owned:
                raise KeyError(kg)

    def _bound(self) -> StateLayout:
        if self._layout is None:
            raise RuntimeError("state store used before a stage bound its layout")
        return self._layout

    # --- the stage's view: rows carry their key group in column KG --------------------------

    def read(self, kgs: Iterable[int], segment: int = 0) -> pa.Table | None:
        """The rows of these key groups in `segment`."""
        kgs = sorted({int(kg) for kg in kgs})
        self._check(kgs)
        return self._backend.read(kgs, segment)

    def update(self, segment: int, kgs: Iterable[int], merge: Merge) -> None:
        """Rewrite the rows of these key groups in `segment`: `merge(rows)` returns (new rows, rows upserted,
        identity columns of rows deleted), every table with KG; the last two are recorded as changes."""
        kgs = sorted({int(kg) for kg in kgs})
        rows, upserted, deleted = merge(self.read(kgs, segment))
        if rows is not None and rows.num_rows:
            strays = sorted(set(np.unique(rows.column(KG).to_numpy()).tolist()) - set(kgs))
            if strays:
                raise ValueError(f"rows of key groups {strays} written to segment {segment} of key groups {kgs}")
        self._backend.write(segment, kgs, rows)
        for changed, gone in ((upserted, False), (deleted, True)):
            if changed is not None:
                self._pending.rows(changed, gone, segment)

    def due(self, bounds: Mapping[int, int]) -> dict[int, list[int]]:
        """Per segment, ascending, the key groups holding rows in it at or under their bound."""
        self._check(bounds)
        due: dict[int, list[int]] = {}
        for kg, bound in bounds.items():
            for segment in self._backend.segments(kg):
                if segment <= bound:
                    due.setdefault(segment, []).append(kg)
        return dict(sorted(due.items()))

    def cut(self, bounds: Mapping[int, int]) -> pa.Table | None:
        """Take out every row whose segment is at most its key group's bound (without KG)."""
        due = self.due(bounds)
        for kg in sorted({kg for kgs in due.values() for kg in kgs}):
            self._pending.cut(kg, bounds[kg])
        taken = []
        for segment, kgs in due.items():
            taken.append(self._backend.read(kgs, segment))
            self._backend.write(segment, kgs, None)
        rows = concat(taken)
        return None if rows is None else rows.drop_columns([KG])

    def segments(self, kg: int) -> list[int]:
        """The segments a key group holds rows in, ascending."""
        self._check([kg])
        return self._backend.segments(kg)

    # --- recovery's view -----------------------------------------------------------------------

    def table(self, kg: int) -> pa.Table | None:
        """All of a key group's rows (without KG): what its snapshot holds."""
        self._check([kg])
        rows = concat(self._backend.read((kg,), s) for s in self._backend.segments(kg))
        return None if rows is None else rows.drop_columns([KG])

    def load(self, kg: int, table: pa.Table | Iterable | None = None) -> None:
        """Replace a key group's state; a key group not owned yet is taken over (restore, prestage)."""
        if not isinstance(table, pa.Table):
            if table is not None and any(True for _ in table):
                raise TypeError("a key group's state loads from an Arrow table")
            table = None
        if kg not in self._key_groups:
            self._key_groups = (*self._key_groups, kg)
        self._backend.drop(kg)
        if table is None or not table.num_rows:
            return
        table = _owned_by(kg, table)
        groups = groups_of(self._bound().segments_of(table))
        for segment, positions in groups:
            self._backend.write(segment, (kg,), table if len(groups) == 1 else take(table, positions))

    def apply(self, kg: int, changes: ChangeSet) -> None:
        """Replay a changelog entry (or several, folded) without recording it again."""
        self._check([kg])
        layout = self._bound()
        if changes.reset:
            self._backend.drop(kg)
        if changes.cut is not None:
            for segment in self._backend.segments(kg):
                if segment <= changes.cut:
                    self._backend.write(segment, (kg,), None)
        split = {}
        for name, part in (("upserts", changes.upserts), ("deletes", changes.deletes)):
            if part is not None and part.num_rows:
                for segment, positions in groups_of(layout.segments_of(part)):
                    split.setdefault(segment, {})[name] = take(part, positions)
        for segment, parts in split.items():
            current = self._backend.read((kg,), segment)
            upserts = parts.get("upserts")
            self._backend.write(segment, (kg,), replace_rows(
                current, None if upserts is None else _owned_by(kg, upserts), parts.get("deletes"), layout.key))

    def reset(self) -> int:
        """Drop every row of every owned key group, recorded as a reset that commits with the batch (a live
        change that starts the stage's state afresh); the next stage binds its own layout. Returns the rows
        dropped."""
        dropped = 0
        for kg in self._key_groups:
            dropped += sum(self._backend.read((kg,), s).num_rows for s in self._backend.segments(kg))
            self._backend.drop(kg)
            self._pending.reset(kg)
        self._layout = None
        return dropped

    def release(self, kg: int) -> None:
        """Forget a key group handed over to another instance (its changes were committed)."""
        self._check([kg])
        if self._pending.holds(kg):
            raise RuntimeError(f"key group {kg} released with uncommitted changes")
        self._key_groups = tuple(k for k in self._key_groups if k != kg)
        self._backend.drop(kg)

    def drain_changes(self) -> dict[int, ChangeSet]:
        """Changes since the last drain, one ChangeSet per changed key group."""
        if not self._pending:
            return {}
        changes = self._pending.fold(self._layout)
        self._pending = ChangeLog()
        return changes


def _owned_by(kg: int, rows: pa.Table) -> pa.Table:
    return rows.append_column(KG, pa.array(np.full(rows.num_rows, kg, dtype=np.int64)))


def open_store(backend: str, key_groups: Iterable[int], directory: str,
               layout: StateLayout | None = None) -> KeyGroupStore:
    key_groups = tuple(key_groups)
    if backend == "rocksdb":
        return KeyGroupStore(key_groups, RocksDBBackend(directory), layout)
    return KeyGroupStore(key_groups, layout=layout)
