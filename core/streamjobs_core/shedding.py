"""Load shedding at a source: which records of a batch are dropped while the source's backlog is over
its bound (`loadShedding` in a source's spec; off unless set).

Shedding is never silent: each shedding batch is logged in the job's shed stream, in the same commit
as the source's offsets, with how many records it dropped and, for generator sources, the batch's
partition ranges. The choice of records is a pure function of the batch (its rows and ranges), so
the oracle regenerates a logged batch, repeats the choice and expects exactly the records kept. An
external stream's records cannot be regenerated: its entries name the IDs of the records shed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .spec import LoadShedding

if TYPE_CHECKING:
    from .exchange import Streams

Ranges = list[tuple[int, int, int]]  # (partition, first local index, end) of a generator source's batch


def shed_mask(table: pa.Table, shedding: LoadShedding, ranges: Ranges) -> np.ndarray:
    """True for each row to drop: round(fraction x rows) of them, the lowest priorities first (ties and
    nulls: earlier rows, nulls lowest) or, without a priority field, drawn by a generator seeded with the
    batch's ranges (random, yet the same for the same batch)."""
    rows = table.num_rows
    shed = round(rows * shedding.fraction)
    mask = np.zeros(rows, dtype=bool)
    if shed == 0:
        return mask
    if shedding.priority_field is not None:
        priority = table.column(shedding.priority_field)
        if pa.types.is_string(priority.type):  # external records: every field is a string
            priority = pa.array([_number(v) for v in priority.to_pylist()], pa.float64())
        order = pc.sort_indices(pa.table({"p": priority}), sort_keys=[("p", "ascending", "at_start")])
        mask[order.to_numpy()[:shed]] = True
    else:
        seed = [rows, *(value for batch_range in ranges for value in batch_range)]
        mask[np.random.default_rng(seed).choice(rows, shed, replace=False)] = True
    return mask


def _number(value: str | None) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def log_entry(op: str, shed: int, kept: int, ranges: Ranges, ids: list[tuple[int, bytes]]) -> dict:
    """`ids`: (partition, entry ID) of each record shed from an external stream, which nothing regenerates."""
    return {"operator": op, "shed": shed, "kept": kept, "ranges": msgpack.packb(ranges), "ids": msgpack.packb(ids)}


def shed_ids(streams: Streams, key: str, op: str) -> set[tuple[int, bytes]]:
    """(partition, entry ID) of every record an external-stream source shed."""
    return {(p, entry_id) for _, fields in streams.after({key: None})[key] if fields[b"operator"].decode() == op
            for p, entry_id in msgpack.unpackb(fields[b"ids"])}


def read_log(streams: Streams, key: str) -> list[tuple[str, int, Ranges]]:
    """(operator, records shed, ranges) of every logged shedding batch, oldest first."""
    return [(fields[b"operator"].decode(), int(fields[b"shed"]), [tuple(x) for x in msgpack.unpackb(fields[b"ranges"])])
            for _, fields in streams.after({key: None})[key]]
