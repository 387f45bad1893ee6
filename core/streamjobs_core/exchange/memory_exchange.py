"""The exchange in this process's memory: record streams, and the other values a batch's commit writes
(hashes, sets, lists, whole values), applied under one lock with the memory job store, so that a commit
is checked against its fence and applied with no fencing change in between, as WATCH and MULTI/EXEC do."""

from __future__ import annotations

from collections.abc import Sequence

from ..jobstore import MemoryJobStore
from ..layout import JobKeys
from ..statelog import changelog_fields
from .commit import Fence, Transaction
from .memory_streams import MemoryStreams, encoded


class MemoryExchange(MemoryStreams):
    def __init__(self, jobs: MemoryJobStore, keys: JobKeys) -> None:
        super().__init__(lock=jobs.lock)
        self._jobs = jobs
        self._keys = keys
        self._hashes: dict[str, dict[bytes, bytes]] = {}
        self._sets: dict[str, set[bytes]] = {}
        self._lists: dict[str, list[bytes]] = {}
        self._values: dict[str, bytes] = {}
        jobs.attach(self)

    def commit(self, txn: Transaction, fence: Fence) -> dict[int, bytes]:
        changelog = self._keys.changelog
        with self._changed:
            fence.check(*self._jobs.fencing(fence.op, fence.instance))
            for key, fields, maxlen in txn.xadds:
                self._append(key, fields, maxlen)
            ids = {kg: self._append(changelog(fence.op, kg), changelog_fields(txn.changelog[kg]), None)
                   for kg in sorted(txn.changelog)}
            for rows in txn.rows:
                for i in range(len(rows.columns[0])):
                    entry = {name: column[i] for name, column in zip(rows.names, rows.columns)
                             if column[i] is not None}
                    self._append(rows.key, entry, rows.maxlen)
            for key, value in txn.values.items():
                self._values[key] = encoded(value)
            for key, mapping in txn.hsets.items():
                self._hashes.setdefault(key, {}).update({encoded(f): encoded(v) for f, v in mapping.items()})
            for key, field_, amount in txn.hincrs:
                fields = self._hashes.setdefault(key, {})
                fields[encoded(field_)] = encoded(int(fields.get(encoded(field_), b"0")) + amount)
            for key, minid in txn.trims.items():
                self._trim(key, minid)
            for key, value in txn.rpushes:
                self._lists.setdefault(key, []).append(encoded(value))
            for key, value in txn.sadds:
                self._sets.setdefault(key, set()).add(encoded(value))
            for key, fields in txn.hdels:
                for f in fields:
                    self._hashes.get(key, {}).pop(encoded(f), None)
            for key in txn.deletes:
                for kept in (self._streams, self._hashes, self._sets, self._lists, self._values):
                    kept.pop(key, None)
            for write in txn.in_commit:
                write()
        return ids

    def hashes(self, keys: Sequence[str]) -> list[dict[bytes, bytes]]:
        with self._changed:
            return [dict(self._hashes.get(key, {})) for key in keys]

    def hash_fields(self, key: str, fields: list[str]) -> list[bytes | None]:
        with self._changed:
            kept = self._hashes.get(key, {})
            return [kept.get(encoded(f)) for f in fields]

    def members(self, key: str) -> set[bytes]:
        with self._changed:
            return set(self._sets.get(key, ()))

    def items(self, key: str) -> list[bytes]:
        with self._changed:
            return list(self._lists.get(key, ()))

    def value(self, key: str) -> bytes | None:
        with self._changed:
            return self._values.get(key)
