"""One micro-batch's effects, committed atomically (the checkpoint).

Outputs, changelog entries, input offsets and watermark progress of a batch go
into one commit of the exchange (a MULTI/EXEC in the job's slot over Redis),
fenced by the instance's incarnation and its operator's assignment generation:
a batch either happened completely or not at all, so
a restarted worker that replays from the committed offsets neither loses nor
duplicates anything.
"""

from __future__ import annotations

from collections.abc import Callable

from streamjobs_core.exchange import Exchange, Fence, Transaction
from streamjobs_core.layout import JobKeys

from . import recovery
from .state import KeyGroupStore


class Checkpoint:
    """Owns the order in which a batch becomes durable: drain the state changes into the transaction ->
    fenced commit -> release the key groups handed over in it -> snapshot what changed, when due.

    Every write, snapshots included, is fenced by the instance's incarnation and its operator's
    assignment generation: a worker that was replaced (a restart, a revoking rescale) can neither commit
    nor overwrite a newer owner's snapshot with state it no longer owns.
    """

    def __init__(self, exchange: Exchange, keys: JobKeys, op: str, instance: int, incarnation: int,
                 store: KeyGroupStore | None = None, snapshot_every_batches: int = 50) -> None:
        self._exchange = exchange
        self._keys = keys
        self._op = op
        self._fence = Fence(op, instance, incarnation)
        self._store = store
        self.snapshot_every = snapshot_every_batches
        self._batches = 0
        self.changelog_ids: dict[int, bytes] = {}  # per key group: the last changelog entry committed or applied
        self._unsnapshotted: set[int] = set()
        self._snapshot_sizes: dict[int, int] = {}

    def complete(self, txn: Transaction, releases: dict[int, int],
                 let_go: Callable[[dict[int, int]], None]) -> int | None:
        """Make the batch durable, then `let_go` drops the key groups it released (`releases`, key group ->
        new owner, recorded in `txn` by the caller). Returns the bytes of state snapshotted when a snapshot
        was due, else None."""
        if self._store is not None:
            for kg, changes in self._store.drain_changes().items():
                txn.changelog[kg] = changes
        if not txn.empty:
            ids = self.commit(txn)
            self.changelog_ids.update(ids)
            self._unsnapshotted.update(ids)
        if releases:
            let_go(releases)  # before any snapshot: the new owner's changelog is not ours to trim
            for kg in releases:
                self.changelog_ids.pop(kg, None)
                self._unsnapshotted.discard(kg)
                self._snapshot_sizes.pop(kg, None)
        self._batches += 1
        if self._batches % self.snapshot_every == 0 and self._unsnapshotted:
            return self.snapshot()
        return None

    def snapshot(self) -> int:
        """Snapshot every key group changed since its last snapshot; the state bytes held in snapshots."""
        txn = Transaction()
        for kg in sorted(self._unsnapshotted):
            self._snapshot_sizes[kg] = recovery.write_snapshot(
                txn, self._keys, self._op, kg, self.changelog_ids[kg], self._store.table(kg))
        self._exchange.commit(txn, self._fence)
        self._unsnapshotted.clear()
        return sum(self._snapshot_sizes.values())

    def commit(self, txn: Transaction) -> dict[int, bytes]:
        """Apply the transaction atomically; return the changelog entry id of every changed key group."""
        changelog_ids = self._exchange.commit(txn, self._fence)
        for callback in txn.after_commit:
            callback()
        return changelog_ids
