"""Durable state in the exchange: per-key-group changelog streams bounded by snapshots.

A snapshot holds a key group's whole state and the id of the last changelog
entry it includes; the changelog is trimmed up to that id in the same
transaction, so the exchange keeps one snapshot plus a short tail per key group. Both
are columnar: a snapshot is the key group's rows as one Arrow IPC stream (the
covered id in its schema's metadata), a changelog entry a ChangeSet (rows
upserted and keys deleted as Arrow IPC, the cut as a number). A restore or a
catch-up folds a key group's entries into one ChangeSet and applies that once.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import redis
from streamjobs_core.exchange import Exchange, Transaction, entry_order, next_entry
from streamjobs_core.exchange.redis_exchange import apply
from streamjobs_core.layout import JobKeys
from streamjobs_core.statelog import read_changes, read_snapshot, snapshot_bytes

from .state import ChangeLog, KeyGroupStore


def restore(
    exchange: Exchange, keys: JobKeys, op: str, store: KeyGroupStore, since: dict[int, bytes] | None = None
) -> dict[int, bytes]:
    """Bring every key group of the store to its last committed change; return the last changelog ids.

    `since` says how far a prestaged store got already: only what happened after it is applied.
    """
    applied = dict(since or {})
    catch_up(exchange, keys, op, store, applied, store.key_groups)
    return applied


def catch_up(
    exchange: Exchange, keys: JobKeys, op: str, store: KeyGroupStore, applied: dict[int, bytes], kgs: Iterable[int]
) -> int:
    """Apply to `store` the changes of `kgs` after `applied` (updated in place); return how many entries.

    A key group whose snapshot covers more than was applied is loaded from it. The owner may snapshot
    (and trim the changelog) while this runs, as it does during a prestage: a key group whose snapshot
    moved past what was read is read again.
    """
    entries = 0
    pending = list(kgs)
    while pending:
        snapshots = {}
        for kg, covered in _covered(exchange, keys, op, pending).items():
            if _newer(covered, applied.get(kg)):
                covered, snapshots[kg] = read_snapshot(exchange.value(keys.snapshot(op, kg)))
                applied[kg] = covered
        log = ChangeLog()
        found = exchange.after({keys.changelog(op, kg): applied.get(kg) for kg in pending})
        for kg in pending:
            for entry_id, fields in found[keys.changelog(op, kg)]:
                log.add(kg, read_changes(fields))
                applied[kg] = entry_id
                entries += 1
        for kg, table in snapshots.items():  # rows a later reset dropped may not even fit the stage's layout
            store.load(kg, None if log.was_reset(kg) else table)
        for kg, changes in log.fold(store.layout).items():
            store.apply(kg, changes)
        pending = [kg for kg, covered in _covered(exchange, keys, op, pending).items()
                   if _newer(covered, applied.get(kg))]
    return entries


def _covered(exchange: Exchange, keys: JobKeys, op: str, kgs: list[int]) -> dict[int, bytes | None]:
    """The changelog entry each key group's snapshot covers (None: no snapshot)."""
    return dict(zip(kgs, exchange.hash_fields(keys.snapshot_ids(op), [str(kg) for kg in kgs])))


def _newer(entry_id: bytes | None, than: bytes | None) -> bool:
    if entry_id is None:
        return False
    return than is None or entry_order(entry_id) > entry_order(than)


def snapshot(
    r: redis.Redis, keys: JobKeys, op: str, store: KeyGroupStore, last_ids: dict[int, bytes], kgs: Iterable[int]
) -> int:
    """Write snapshots of the given key groups at their last committed changelog ids, unfenced (a worker's go
    through its checkpoint); return bytes written."""
    txn = Transaction()
    written = sum(write_snapshot(txn, keys, op, kg, last_ids[kg], store.table(kg)) for kg in kgs if kg in last_ids)
    apply(r, txn, lambda kg: keys.changelog(op, kg))
    return written


def write_snapshot(txn: Transaction, keys: JobKeys, op: str, kg: int, covered: bytes, table: pa.Table | None) -> int:
    """Add a key group's snapshot (its rows) covering changelog entry `covered`, and the trim of what it covers,
    to the transaction; the snapshot's bytes."""
    data = snapshot_bytes(table, covered)
    txn.values[keys.snapshot(op, kg)] = data
    txn.hset(keys.snapshot_ids(op), {str(kg): covered})
    txn.trims[keys.changelog(op, kg)] = next_entry(covered)
    return len(data)
