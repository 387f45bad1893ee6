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


def restore(
    r: redis.Redis, keys: JobKeys, op: str, store: KeyGroupStore, since: dict[int, bytes] | None = None
) -> dict[int, bytes]:
    """Bring every key group of the store to its last committed change; return the last changelog ids.

    `since` says how far a prestaged store got already: only what happened after it is applied.
    """
    applied = dict(since or {})
    catch_up(r, keys, op, store, applied, store.key_groups)
    return applied


def catch_up(
    r: redis.Redis, keys: JobKeys, op: str, store: KeyGroupStore, applied: dict[int, bytes], kgs: Iterable[int]
) -> int:
    """Apply to `store` the changes of `kgs` after `applied` (updated in place); return how many entries.

    A key group whose snapshot covers more than was applied is loaded from it. The owner may snapshot
    (and trim the changelog) while this runs, as it does during a prestage: a key group whose snapshot
    moved past what was read is read again.
    """
    entries = 0
    pending = list(kgs)
    while pending:
        for kg, covered in _covered(r, keys, op, pending).items():
            if _newer(covered, applied.get(kg)):
                covered, items = unpack(r.get(keys.snapshot(op, kg)))
                store.load(kg, items)
                applied[kg] = covered
        for kg in pending:
            start = b"(" + applied[kg] if kg in applied else b"-"
            for entry_id, fields in r.xrange(keys.changelog(op, kg), min=start):
                store.apply(kg, unpack(fields[b"c"]))
                applied[kg] = entry_id
                entries += 1
        pending = [kg for kg, covered in _covered(r, keys, op, pending).items() if _newer(covered, applied.get(kg))]
    return entries


def _covered(r: redis.Redis, keys: JobKeys, op: str, kgs: list[int]) -> dict[int, bytes | None]:
    return dict(zip(kgs, r.hmget(keys.snapshot_ids(op), [str(kg) for kg in kgs])))


def _newer(entry_id: bytes | None, than: bytes | None) -> bool:
    if entry_id is None:
        return False
    return than is None or _order(entry_id) > _order(than)


def _order(entry_id: bytes) -> tuple[int, int]:
    ms, seq = entry_id.split(b"-")
    return int(ms), int(seq)


def snapshot(
    r: redis.Redis, keys: JobKeys, op: str, store: KeyGroupStore, last_ids: dict[int, bytes], kgs: Iterable[int]
) -> int:
    """Write snapshots of the given key groups at their last committed changelog ids; return bytes written."""
    written = 0
    pipe = r.pipeline(transaction=True)
    for kg in kgs:
        if kg not in last_ids:
            continue
        written += write_snapshot(pipe, keys, op, kg, last_ids[kg], store.items(kg))
    pipe.execute()
    return written


def write_snapshot(pipe, keys: JobKeys, op: str, kg: int, covered: bytes, items: Iterable) -> int:
    """Queue a key group's snapshot covering changelog entry `covered` and the trim of what it covers."""
    data = pack([covered, list(items)])
    pipe.set(keys.snapshot(op, kg), data)
    pipe.hset(keys.snapshot_ids(op), str(kg), covered)
    pipe.xtrim(keys.changelog(op, kg), minid=_after(covered))
    return len(data)


def changelog_fields(changes: list) -> dict[bytes, bytes]:
    return {b"c": pack(changes)}


def _after(entry_id: bytes) -> bytes:
    ms, seq = entry_id.split(b"-")
    return ms + b"-" + str(int(seq) + 1).encode()
