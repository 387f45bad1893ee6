"""Durable state in Redis: per-key-group changelog streams bounded by snapshots.

A snapshot holds a key group's whole state and the id of the last changelog
entry it includes; the changelog is trimmed up to that id in the same
transaction, so Redis keeps one snapshot plus a short tail per key group.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis
from streamjobs_core.layout import JobKeys

from .state import KeyGroupStore, pack, unpack


def restore(r: redis.Redis, keys: JobKeys, op: str, store: KeyGroupStore) -> dict[int, bytes]:
    """Load snapshot + changelog tail of every key group in the store; return last changelog ids."""
    last_ids: dict[int, bytes] = {}
    for kg in store.key_groups:
        snapshot = r.get(keys.snapshot(op, kg))
        start = b"-"
        if snapshot is not None:
            covered, items = unpack(snapshot)
            store.load(kg, items)
            start = b"(" + covered
            last_ids[kg] = covered
        for entry_id, fields in r.xrange(keys.changelog(op, kg), min=start):
            store.apply(kg, unpack(fields[b"c"]))
            last_ids[kg] = entry_id
    return last_ids


def snapshot(
    r: redis.Redis, keys: JobKeys, op: str, store: KeyGroupStore, last_ids: dict[int, bytes], kgs: Iterable[int]
) -> int:
    """Write snapshots of the given key groups at their last committed changelog ids; return bytes written."""
    written = 0
    pipe = r.pipeline(transaction=True)
    for kg in kgs:
        if kg not in last_ids:
            continue
        data = pack([last_ids[kg], list(store.items(kg))])
        written += len(data)
        pipe.set(keys.snapshot(op, kg), data)
        pipe.xtrim(keys.changelog(op, kg), minid=_after(last_ids[kg]))
    pipe.execute()
    return written


def changelog_fields(changes: list) -> dict[bytes, bytes]:
    return {b"c": pack(changes)}


def _after(entry_id: bytes) -> bytes:
    ms, seq = entry_id.split(b"-")
    return ms + b"-" + str(int(seq) + 1).encode()
