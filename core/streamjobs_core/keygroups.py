"""Key groups: the unit of state, routing and migration.

A record's key hashes to one of maxParallelism key groups; an operator instance
owns a set of key groups. Routing depends only on the key and maxParallelism,
never on the current parallelism, so a rescale changes ownership and nothing
upstream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa


def key_groups_of(keys: pa.Array | pa.ChunkedArray | np.ndarray, max_parallelism: int) -> np.ndarray:
    """Key group of every key; stable across processes (unlike Python's salted hash())."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        keys = keys.to_numpy(zero_copy_only=False)
    hashes = pd.util.hash_array(np.asarray(keys), categorize=False)
    return (hashes % np.uint64(max_parallelism)).astype(np.int64)


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

    @property
    def parallelism(self) -> int:
        return max(self.owners) + 1

    def key_groups_of(self, instance: int) -> tuple[int, ...]:
        return tuple(kg for kg, owner in enumerate(self.owners) if owner == instance)

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "owners": list(self.owners)}

    @classmethod
    def from_dict(cls, data: dict) -> Assignment:
        return cls(int(data["epoch"]), tuple(int(o) for o in data["owners"]))


def runs(key_groups: tuple[int, ...] | list[int]) -> list[tuple[int, int]]:
    """Compress sorted key groups into inclusive (lo, hi) runs for compact entry headers."""
    out: list[tuple[int, int]] = []
    for kg in sorted(key_groups):
        if out and out[-1][1] == kg - 1:
            out[-1] = (out[-1][0], kg)
        else:
            out.append((kg, kg))
    return out
