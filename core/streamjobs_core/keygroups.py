"""Key groups: the unit of state, routing and migration.

A record's key hashes to one of maxParallelism key groups; an operator instance
owns a set of key groups. Routing depends only on the key and maxParallelism,
never on the current parallelism, so a rescale changes ownership and nothing
upstream.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def key_groups_of(keys: pa.Array | pa.ChunkedArray | np.ndarray, max_parallelism: int) -> np.ndarray:
    """Key group of every key; stable across processes (unlike Python's salted hash())."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        if keys.null_count and (pa.types.is_integer(keys.type) or pa.types.is_boolean(keys.type)):
            # to_numpy would turn these into float or object arrays, which hash differently:
            # a key's group must not depend on whether its batch holds a null key.
            groups = key_groups_of(keys.fill_null(False if pa.types.is_boolean(keys.type) else 0), max_parallelism)
            groups[keys.is_null().to_numpy(zero_copy_only=False)] = _null_key_group(max_parallelism)
            return groups
        if _is_text(keys.type):
            return _text_key_groups(keys, max_parallelism)
        keys = keys.to_numpy(zero_copy_only=False)
    return _object_key_groups(np.asarray(keys), max_parallelism)


def _object_key_groups(keys: np.ndarray, max_parallelism: int) -> np.ndarray:
    if keys.dtype.kind == "U":  # pandas hashes str objects, not fixed-width numpy strings
        keys = keys.astype(object)
    elif keys.dtype.kind in "iu" and keys.dtype.itemsize < 8:
        keys = keys.astype(np.int64)  # pandas hashes the bits: int32 -1 would not hash like int64 -1
    hashes = pd.util.hash_array(keys, categorize=False)
    return (hashes % np.uint64(max_parallelism)).astype(np.int64)


_SAMPLE = 4096  # rows of a string chunk looked at to tell whether its keys repeat


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
        or pa.types.is_large_binary(kind)


def _text_key_groups(keys: pa.Array | pa.ChunkedArray, max_parallelism: int) -> np.ndarray:
    """Strings hash as Python objects, at a cost per value. Where keys repeat (words, campaigns), each
    distinct value of a chunk is hashed once and its group spread to every row that holds it; where a
    sample of the chunk says they mostly do not, encoding them first would only add to the cost."""
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    parts = []
    for chunk in chunks:
        sample = chunk.slice(0, _SAMPLE)
        if len(sample) and pc.count_distinct(sample, mode="all").as_py() > len(sample) // 2:
            parts.append(_object_key_groups(chunk.to_numpy(zero_copy_only=False), max_parallelism))
            continue
        encoded = pc.dictionary_encode(chunk)
        distinct = _object_key_groups(encoded.dictionary.to_numpy(zero_copy_only=False), max_parallelism)
        indices = encoded.indices
        if indices.null_count:  # a null key: one more distinct value, after the others
            distinct = np.append(distinct, _null_key_group(max_parallelism))
            indices = indices.fill_null(len(distinct) - 1)
        parts.append(distinct[indices.to_numpy()])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def key_groups_of_columns(table: pa.Table, columns: tuple[str, ...], max_parallelism: int) -> np.ndarray:
    """Key group of every row of `table` by a key of one or more columns. One column hashes exactly as
    `key_groups_of`; several combine their columns' hashes, so the two inputs of a join that name their
    key columns differently (`seller` and `id`) still meet in one key group."""
    if len(columns) == 1:
        return key_groups_of(table.column(columns[0]), max_parallelism)
    combined = np.zeros(table.num_rows, dtype=np.uint64)
    for name in columns:
        # A column's key groups at the largest modulus are its hash, less the bits the modulus drops.
        part = key_groups_of(table.column(name), 2**62).astype(np.uint64)
        combined = combined * np.uint64(1_000_003) ^ part
    return (combined % np.uint64(max_parallelism)).astype(np.int64)


def _null_key_group(max_parallelism: int) -> int:
    """Where null keys go: where None goes in a string (object) column."""
    return int(key_groups_of(np.array([None], dtype=object), max_parallelism)[0])


def range_of_instance(instance: int, parallelism: int, max_parallelism: int) -> range:
    """Flink's contiguous key-group range of one operator instance."""
    start = (instance * max_parallelism + parallelism - 1) // parallelism
    end = ((instance + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


@dataclass(frozen=True)
class Assignment:
    """Owner instance of every key group of one operator, versioned by an epoch."""

    epoch: int
    owners: tuple[int, ...]

    @classmethod
    def ranges(cls, parallelism: int, key_groups: int, epoch: int = 1) -> Assignment:
        owners = [0] * key_groups
        for instance in range(parallelism):
            for kg in range_of_instance(instance, parallelism, key_groups):
                owners[kg] = instance
        return cls(epoch, tuple(owners))

    @classmethod
    def consistent_hashing(cls, parallelism: int, key_groups: int, epoch: int = 1, vnodes: int = 64) -> Assignment:
        """Rhino-style ring: each instance holds `vnodes` points; a key group goes to the next point.

        Changing the parallelism moves only the key groups whose next point changed,
        about |new - old| / max(new, old) of them, where ranges move most of them.
        """
        ring = sorted((_ring_hash(f"instance-{i}-{v}"), i) for i in range(parallelism) for v in range(vnodes))
        points = [h for h, _ in ring]
        owners = []
        for kg in range(key_groups):
            at = bisect.bisect_left(points, _ring_hash(f"kg-{kg}")) % len(ring)
            owners.append(ring[at][1])
        return cls(epoch, tuple(owners))

    @property
    def parallelism(self) -> int:
        return max(self.owners) + 1

    def owned_by(self, instance: int) -> tuple[int, ...]:
        return tuple(kg for kg, owner in enumerate(self.owners) if owner == instance)


@dataclass(frozen=True)
class Move:
    key_group: int
    source: int
    target: int


def moves(old: Assignment, new: Assignment) -> list[Move]:
    """Key groups whose owner differs between two assignments of one operator."""
    if len(old.owners) != len(new.owners):
        raise ValueError("assignments of different key-group counts")
    return [Move(kg, a, b) for kg, (a, b) in enumerate(zip(old.owners, new.owners)) if a != b]


def _ring_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def runs(key_groups: tuple[int, ...] | list[int]) -> list[tuple[int, int]]:
    """Compress sorted key groups into inclusive (lo, hi) runs for compact entry headers."""
    out: list[tuple[int, int]] = []
    for kg in sorted(key_groups):
        if out and out[-1][1] == kg - 1:
            out[-1] = (out[-1][0], kg)
        else:
            out.append((kg, kg))
    return out
