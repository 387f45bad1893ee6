"""Keyed state partitioned by key group.

The store keeps every key group's state in its own dict so that a key group can
be restored, snapshotted or (later) handed over on its own. Each change is also
recorded as pending changelog until the checkpoint drains it into the batch's
transaction. Redis holds the durable copy (changelog + snapshots, see
recovery.py); the in-process dict is the working copy, which keeps lookups at
dictionary speed for the Python-side merge of Spark's per-batch partials.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any

import msgpack

_DELETED = None


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    # Tuples, not lists: state keys must be hashable after a round trip.
    return msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False)


class KeyGroupStore:
    def __init__(self, key_groups: Iterable[int]) -> None:
        self._data: dict[int, dict[Hashable, Any]] = {kg: {} for kg in key_groups}
        self._pending: dict[int, dict[Hashable, Any]] = {}

    @property
    def key_groups(self) -> tuple[int, ...]:
        return tuple(self._data)

    def get(self, kg: int, key: Hashable, default: Any = None) -> Any:
        return self._data[kg].get(key, default)

    def put(self, kg: int, key: Hashable, value: Any) -> None:
        self._data[kg][key] = value
        self._pending.setdefault(kg, {})[key] = value

    def delete(self, kg: int, key: Hashable) -> None:
        if self._data[kg].pop(key, _DELETED) is not _DELETED or key in self._pending.get(kg, {}):
            self._pending.setdefault(kg, {})[key] = _DELETED

    def items(self, kg: int) -> Iterator[tuple[Hashable, Any]]:
        return iter(self._data[kg].items())

    def drain_changes(self) -> dict[int, list[tuple[Hashable, Any]]]:
        """Changes since the last drain, per key group: (key, value or None for deleted)."""
        changes = {kg: list(kv.items()) for kg, kv in self._pending.items() if kv}
        self._pending = {}
        return changes

    def apply(self, kg: int, changes: Iterable[tuple[Hashable, Any]]) -> None:
        """Replay changelog entries without recording them again."""
        data = self._data[kg]
        for key, value in changes:
            if value is _DELETED:
                data.pop(key, None)
            else:
                data[key] = value

    def load(self, kg: int, items: Iterable[tuple[Hashable, Any]]) -> None:
        self._data[kg] = dict(items)
