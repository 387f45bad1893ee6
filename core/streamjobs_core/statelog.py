"""Keyed state as Redis holds it: the rows of each stage's state, snapshots and changelog entries.

Workers write these (worker/recovery.py) and restore from them; a savepoint restored under another
maxParallelism reads them too, to re-split the rows by key (resplit.py). So their form lives here, once:
how each stage lays out its rows and which of their columns hold the key, a snapshot (a key group's rows
as one Arrow IPC stream, the last changelog entry it covers in the schema's metadata), and a changelog
entry (a ChangeSet: rows upserted and identities deleted as Arrow IPC, the cut as a number, a reset flag).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .keygroups import key_groups_of, key_groups_of_columns

_COVERED = b"covered"


@dataclass(frozen=True)
class StateLayout:
    """Which column names a row within its segment (`key`) and which int64 column is its segment, if any;
    `by_time`: each segment spans a bounded stretch of event time (a window, a pane), so a batch rewrites the
    segments it touches for most key groups at once, and a segment never grows with the whole state."""

    key: str
    segment: str | None = None
    by_time: bool = False

    @property
    def identity(self) -> list[str]:
        return [self.segment, self.key] if self.segment else [self.key]

    def segments_of(self, rows: pa.Table) -> np.ndarray:
        if self.segment is None:
            return np.zeros(rows.num_rows, dtype=np.int64)
        return rows.column(self.segment).to_numpy()


WINDOW_STATE = StateLayout(key="k", segment="ws", by_time=True)  # a row per key and window start; a segment per window
OVER_STATE = StateLayout(key="_rid", segment="_seg")  # a row per record, kept apart by a row id
# A join keeps both sides' rows in one state: a segment per pane and side (2 * pane + side), each side's columns
# prefixed by it.
JOIN_STATE = StateLayout(key="_rid", segment="_seg", by_time=True)
JOIN_PREFIXES = ("l_", "r_")


def state_layout(spec) -> StateLayout | None:
    """How a stage's state is laid out (None: the stage keeps none)."""
    if spec.type == "window_aggregate":
        return WINDOW_STATE
    if spec.type == "stateful":
        return StateLayout(spec.key_by)
    if spec.type == "join":
        return JOIN_STATE
    if spec.type == "over":
        return OVER_STATE
    return None


def row_key_groups(spec, rows: pa.Table, max_parallelism: int) -> np.ndarray:
    """The key group of each state row of the stage under `max_parallelism`: where the stage's input routing
    sends its key (outputs.py), as the stage itself computes it for the rows it keeps."""
    if spec.type == "window_aggregate":
        return key_groups_of(rows.column(WINDOW_STATE.key), max_parallelism)
    if spec.type in ("stateful", "over"):
        return key_groups_of(rows.column(spec.key_by), max_parallelism)
    if spec.type == "join":
        sides = rows.column(JOIN_STATE.segment).to_numpy() % 2
        out = np.empty(rows.num_rows, dtype=np.int64)
        for side, keys in enumerate((spec.on.left, spec.on.right)):
            mask = sides == side
            if mask.any():
                part = rows.filter(pa.array(mask)).select([JOIN_PREFIXES[side] + c for c in keys])
                out[mask] = key_groups_of_columns(part.rename_columns(list(keys)), tuple(keys), max_parallelism)
        return out
    raise ValueError(f"{spec.name}: a {spec.type} stage keeps no keyed state")


@dataclass(frozen=True)
class ChangeSet:
    """A key group's changes, applied in this order: `reset` (every row is gone: the stage's state was reset
    by a live change), `cut` (every row whose segment is at most it is gone: the windows that fired),
    `deletes` (the identity columns of rows gone), `upserts` (whole rows)."""

    upserts: pa.Table | None = None
    deletes: pa.Table | None = None
    cut: int | None = None
    reset: bool = False


def replay(rows: pa.Table | None, changes: ChangeSet, layout: StateLayout) -> pa.Table | None:
    """A key group's rows after one changelog entry (recovery.py folds many at once; this is the plain order)."""
    if changes.reset:
        rows = None
    if rows is not None and changes.cut is not None and layout.segment is not None:
        rows = rows.filter(pc.greater(rows.column(layout.segment), changes.cut))
    for gone in (changes.deletes, changes.upserts):
        if rows is not None and rows.num_rows and gone is not None and gone.num_rows:
            rows = rows.filter(pc.invert(_among(rows, gone, layout)))
    return concat([rows, changes.upserts])


def _among(rows: pa.Table, gone: pa.Table, layout: StateLayout) -> pa.Array:
    """Whether each row's identity is one of `gone`'s (null keys equal, as rows keep them)."""
    def keys_in(table: pa.Table, values: pa.Table) -> pa.Array:
        column = values.column(layout.key).cast(table.schema.field(layout.key).type)
        return pc.is_in(table.column(layout.key), value_set=column.combine_chunks(), skip_nulls=False)

    if layout.segment is None:
        return keys_in(rows, gone)
    mask = np.zeros(rows.num_rows, dtype=bool)
    segments, gone_segments = rows.column(layout.segment).to_numpy(), gone.column(layout.segment).to_numpy()
    for segment in np.unique(gone_segments):
        here = segments == segment
        if here.any():
            values = gone.filter(pa.array(gone_segments == segment))
            mask[here] = keys_in(rows.filter(pa.array(here)), values).to_numpy(zero_copy_only=False)
    return pa.array(mask)


def concat(tables: Iterable[pa.Table | None]) -> pa.Table | None:
    present = [t for t in tables if t is not None and t.num_rows]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    joined = pa.concat_tables(present, promote_options="permissive")
    if all(t.schema == present[0].schema for t in present[1:]):
        return joined
    # Rows from before a column was gained live: permissive concat fills them with nulls but keeps the field
    # `not null` where the newer tables declared it so, and Spark, trusting that, fails on the nulls.
    return joined.cast(pa.schema([f.with_nullable(True) for f in joined.schema], metadata=joined.schema.metadata))


def to_ipc(table: pa.Table, metadata: dict[bytes, bytes] | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    schema = table.schema.with_metadata(metadata) if metadata else table.schema
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def snapshot_bytes(table: pa.Table | None, covered: bytes) -> bytes:
    """A key group's snapshot: its rows, covering changelog entry `covered` (its later entries apply on top)."""
    return to_ipc(pa.table({}) if table is None else table, {_COVERED: covered})


def read_snapshot(data: bytes) -> tuple[bytes, pa.Table | None]:
    """(the last changelog id it covers, the key group's rows or None when it had none)."""
    table = from_ipc(data)
    covered = table.schema.metadata[_COVERED]
    return covered, (table.replace_schema_metadata(None) if table.num_rows else None)


def changelog_fields(changes: ChangeSet) -> dict[bytes, bytes]:
    fields = {}
    if changes.upserts is not None:
        fields[b"u"] = to_ipc(changes.upserts)
    if changes.deletes is not None:
        fields[b"d"] = to_ipc(changes.deletes)
    if changes.cut is not None:
        fields[b"x"] = str(changes.cut).encode()
    if changes.reset:
        fields[b"r"] = b"1"
    return fields


def read_changes(fields: dict[bytes, bytes]) -> ChangeSet:
    upserts, deletes, cut = fields.get(b"u"), fields.get(b"d"), fields.get(b"x")
    return ChangeSet(
        None if upserts is None else from_ipc(upserts),
        None if deletes is None else from_ipc(deletes),
        None if cut is None else int(cut),
        b"r" in fields,
    )
