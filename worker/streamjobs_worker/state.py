"""Keyed state partitioned by key group.

The store keeps every key group's state in its own dict so that a key group can
be restored, snapshotted or (later) handed over on its own. Each change is also
recorded as pending changelog until the checkpoint drains it into the batch's
transaction. Redis holds the durable copy (changelog + snapshots, see
recovery.py); a backend holds the working copy: `memory` (dicts, the default:
lookups at dictionary speed for the merge of Spark's per-batch partials) or
`rocksdb` (rocksdict, as quix-streams does: state beyond memory). The working
copy is rebuilt from Redis at every start, so a backend never needs to survive
a restart.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Protocol

import msgpack

_DELETED = None


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    # Tuples, not lists: state keys must be hashable after a round trip.
    return msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False)


class Backend(Protocol):
    def get(self, kg: int, key: Hashable) -> Any: ...
    def set(self, kg: int, key: Hashable, value: Any) -> None: ...
    def remove(self, kg: int, key: Hashable) -> bool: ...
    def scan(self, kg: int) -> Iterator[tuple[Hashable, Any]]: ...
    def replace(self, kg: int, items: Iterable[tuple[Hashable, Any]]) -> None: ...
    def drop(self, kg: int) -> None: ...


class MemoryBackend:
    def __init__(self, key_groups: tuple[int, ...]) -> None:
        self._data: dict[int, dict[Hashable, Any]] = {kg: {} for kg in key_groups}

    def get(self, kg: int, key: Hashable) -> Any:
        return self._data[kg].get(key, _DELETED)

    def set(self, kg: int, key: Hashable, value: Any) -> None:
        self._data[kg][key] = value

    def remove(self, kg: int, key: Hashable) -> bool:
        return self._data[kg].pop(key, _DELETED) is not _DELETED

    def scan(self, kg: int) -> Iterator[tuple[Hashable, Any]]:
        return iter(list(self._data[kg].items()))

    def replace(self, kg: int, items: Iterable[tuple[Hashable, Any]]) -> None:
        self._data[kg] = dict(items)

    def drop(self, kg: int) -> None:
        self._data.pop(kg, None)


class RocksDBBackend:
    """One RocksDB per worker; a key is its key group (4 bytes, big-endian) + the packed key."""

    def __init__(self, key_groups: tuple[int, ...], path: str) -> None:
        from rocksdict import Options, Rdict

        shutil.rmtree(path, ignore_errors=True)  # the working copy is rebuilt from Redis
        self._owned = set(key_groups)
        self._db = Rdict(path, options=Options(raw_mode=True))

    def _key(self, kg: int, key: Hashable) -> bytes:
        if kg not in self._owned:
            raise KeyError(kg)
        return struct.pack(">I", kg) + pack(key)

    def get(self, kg: int, key: Hashable) -> Any:
        data = self._db.get(self._key(kg, key))
        return _DELETED if data is None else unpack(data)

    def set(self, kg: int, key: Hashable, value: Any) -> None:
        self._db[self._key(kg, key)] = pack(value)

    def remove(self, kg: int, key: Hashable) -> bool:
        raw = self._key(kg, key)
        if self._db.get(raw) is None:
            return False
        del self._db[raw]
        return True

    def scan(self, kg: int) -> Iterator[tuple[Hashable, Any]]:
        prefix = struct.pack(">I", kg)
        out = []
        for raw, data in self._db.items(from_key=prefix):
            if not raw.startswith(prefix):
                break
            out.append((unpack(raw[4:]), unpack(data)))
        return iter(out)

    def replace(self, kg: int, items: Iterable[tuple[Hashable, Any]]) -> None:
        self._owned.add(kg)
        self._db.delete_range(struct.pack(">I", kg), struct.pack(">I", kg + 1))
        for key, value in items:
            self.set(kg, key, value)

    def drop(self, kg: int) -> None:
        self._owned.discard(kg)
        self._db.delete_range(struct.pack(">I", kg), struct.pack(">I", kg + 1))


class KeyGroupStore:
    def __init__(self, key_groups: Iterable[int], backend: Backend | None = None) -> None:
        self._key_groups = tuple(key_groups)
        self._backend = backend or MemoryBackend(self._key_groups)
        self._pending: dict[int, dict[Hashable, Any]] = {}

    @property
    def key_groups(self) -> tuple[int, ...]:
        return self._key_groups

    def _check(self, kg: int) -> None:
        if kg not in self._key_groups:
            raise KeyError(kg)

    def get(self, kg: int, key: Hashable, default: Any = None) -> Any:
        self._check(kg)
        value = self._backend.get(kg, key)
        return default if value is _DELETED else value

    def put(self, kg: int, key: Hashable, value: Any) -> None:
        self._check(kg)
        self._backend.set(kg, key, value)
        self._pending.setdefault(kg, {})[key] = value

    def delete(self, kg: int, key: Hashable) -> None:
        self._check(kg)
        if self._backend.remove(kg, key) or key in self._pending.get(kg, {}):
            self._pending.setdefault(kg, {})[key] = _DELETED

    def items(self, kg: int) -> Iterator[tuple[Hashable, Any]]:
        self._check(kg)
        return self._backend.scan(kg)

    def drain_changes(self) -> dict[int, list[tuple[Hashable, Any]]]:
        """Changes since the last drain, per key group: (key, value or None for deleted)."""
        changes = {kg: list(kv.items()) for kg, kv in self._pending.items() if kv}
        self._pending = {}
        return changes

    def apply(self, kg: int, changes: Iterable[tuple[Hashable, Any]]) -> None:
        """Replay changelog entries without recording them again."""
        self._check(kg)
        for key, value in changes:
            if value is _DELETED:
                self._backend.remove(kg, key)
            else:
                self._backend.set(kg, key, value)

    def load(self, kg: int, items: Iterable[tuple[Hashable, Any]]) -> None:
        """Replace a key group's state; a key group not owned yet is taken over (restore, prestage)."""
        if kg not in self._key_groups:
            self._key_groups = (*self._key_groups, kg)
        self._backend.replace(kg, items)

    def release(self, kg: int) -> None:
        """Forget a key group handed over to another instance (its changes were committed)."""
        self._check(kg)
        if self._pending.get(kg):
            raise RuntimeError(f"key group {kg} released with uncommitted changes")
        self._pending.pop(kg, None)
        self._key_groups = tuple(k for k in self._key_groups if k != kg)
        self._backend.drop(kg)


def open_store(backend: str, key_groups: Iterable[int], directory: str) -> KeyGroupStore:
    key_groups = tuple(key_groups)
    if backend == "rocksdb":
        return KeyGroupStore(key_groups, RocksDBBackend(key_groups, directory))
    return KeyGroupStore(key_groups)
