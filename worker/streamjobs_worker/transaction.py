"""One micro-batch's effects, committed atomically (the checkpoint).

Outputs, changelog entries, input offsets and watermark progress of a batch go
into one MULTI/EXEC in the job's slot, fenced by the instance's incarnation and
its operator's assignment generation: a batch either happened completely or not at all, so
a restarted worker that replays from the committed offsets neither loses nor
duplicates anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import redis
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.statelog import changelog_fields

from . import recovery
from .state import KeyGroupStore


class Fenced(RuntimeError):
    """A newer incarnation of this instance, or a new assignment, exists: stop without committing."""


@dataclass(frozen=True)
class RowEntries:
    """Records to add to a stream, an entry each, their fields named by `names`: one value list per name, a
    record's None omitted from its entry. Added by one script call per RowEntries, not a command per record:
    per record, building and sending XADDs from Python cost ~20x what Redis spends adding the entry."""

    key: str
    names: list[str]
    columns: list[list[str | None]]
    maxlen: int | None


# Every record has a value (the sink checks): a script cannot fail half-way, which MULTI would not undo.
_ADD_ROWS = """
local rows, names, columns = tonumber(ARGV[1]), cmsgpack.unpack(ARGV[3]), cmsgpack.unpack(ARGV[4])
for i = 1, rows do
  local entry = {}
  for c = 1, #names do
    local value = columns[c][i]
    if value ~= nil then
      entry[#entry + 1] = names[c]
      entry[#entry + 1] = value
    end
  end
  if ARGV[2] == '' then
    redis.call('XADD', KEYS[1], '*', unpack(entry))
  else
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(entry))
  end
end
return rows
"""


@dataclass
class Transaction:
    xadds: list[tuple[str, dict, int | None]] = field(default_factory=list)
    rows: list[RowEntries] = field(default_factory=list)  # records added as stream entries, one per record
    hsets: dict[str, dict] = field(default_factory=dict)
    hincrs: list[tuple[str, str, int]] = field(default_factory=list)
    trims: dict[str, bytes] = field(default_factory=dict)
    changelog: dict[int, list] = field(default_factory=dict)
    rpushes: list[tuple[str, str]] = field(default_factory=list)
    sadds: list[tuple[str, str]] = field(default_factory=list)
    hdels: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    after_commit: list[Callable[[], None]] = field(default_factory=list)

    def xadd(self, key: str, fields: dict, maxlen: int | None = None) -> None:
        self.xadds.append((key, fields, maxlen))

    def hset(self, key: str, mapping: dict) -> None:
        self.hsets.setdefault(key, {}).update(mapping)

    def hincrby(self, key: str, field_: str, amount: int) -> None:
        self.hincrs.append((key, field_, amount))

    def hdel(self, key: str, *fields: str) -> None:
        self.hdels.append((key, fields))

    def delete(self, key: str) -> None:
        self.deletes.append(key)

    @property
    def empty(self) -> bool:
        return not (self.xadds or self.rows or self.hsets or self.hincrs or self.changelog or self.rpushes or self.sadds
                    or self.hdels or self.deletes)


class Checkpoint:
    """Owns the order in which a batch becomes durable: drain the state changes into the transaction ->
    fenced commit -> release the key groups handed over in it -> snapshot what changed, when due.

    Every write, snapshots included, is fenced by the instance's incarnation and its operator's
    assignment generation: a worker that was replaced (a restart, a revoking rescale) can neither commit
    nor overwrite a newer owner's snapshot with state it no longer owns.
    """

    def __init__(self, r: redis.Redis, jobs: RedisJobStore, op: str, instance: int, incarnation: int,
                 store: KeyGroupStore | None = None, snapshot_every_batches: int = 50) -> None:
        self._r = r
        self._jobs = jobs
        self._keys = jobs.keys
        self._op = op
        self._instance = instance
        self._incarnation = incarnation
        self._generation: bytes | None = None
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
        kgs = sorted(self._unsnapshotted)

        def queue(pipe) -> None:
            for kg in kgs:
                self._snapshot_sizes[kg] = recovery.write_snapshot(
                    pipe, self._keys, self._op, kg, self.changelog_ids[kg], self._store.table(kg))

        self._fenced(queue)
        self._unsnapshotted.clear()
        return sum(self._snapshot_sizes.values())

    def commit(self, txn: Transaction) -> dict[int, bytes]:
        """Apply the transaction atomically; return the changelog entry id of every changed key group."""
        kgs = sorted(txn.changelog)
        results = self._fenced(lambda pipe: self._queue(pipe, txn, kgs))
        changelog_ids = results[len(txn.xadds) : len(txn.xadds) + len(kgs)]
        for callback in txn.after_commit:
            callback()
        return dict(zip(kgs, changelog_ids))

    def _fenced(self, queue: Callable[[redis.client.Pipeline], None]) -> list:
        """Run the commands `queue` adds in one MULTI/EXEC, unless this instance was fenced off."""
        while True:
            try:
                with self._r.pipeline(transaction=True) as pipe:
                    pipe.watch(*self._jobs.fencing_keys(self._op, self._instance))
                    self._check(pipe)
                    pipe.multi()
                    queue(pipe)
                    return pipe.execute()
            except redis.WatchError:
                continue  # the assignment was rewritten: the next try says whether that fences us

    def _check(self, pipe) -> None:
        current, generation = self._jobs.fencing(pipe, self._op, self._instance)
        if current != self._incarnation:
            raise Fenced(f"incarnation {self._incarnation} superseded by {current!r}")
        if self._generation is None:
            self._generation = generation
        elif generation != self._generation:
            raise Fenced(f"assignment generation changed to {generation!r}: the key groups were reassigned")

    def _queue(self, pipe, txn: Transaction, kgs: list[int]) -> None:
        for key, fields, maxlen in txn.xadds:
            pipe.xadd(key, fields, maxlen=maxlen, approximate=True)
        for kg in kgs:
            pipe.xadd(self._keys.changelog(self._op, kg), changelog_fields(txn.changelog[kg]))
        for rows in txn.rows:  # after the changelog's: commit() finds its entry ids by position
            # EVAL, not EVALSHA: a script cache emptied by a restart or failover since it was loaded would fail
            # this one command inside EXEC while the others apply. The script's text is small beside its rows.
            pipe.execute_command("EVAL", _ADD_ROWS, 1, rows.key, len(rows.columns[0]),
                                 "" if rows.maxlen is None else rows.maxlen, msgpack.packb(rows.names),
                                 msgpack.packb(rows.columns))
        for key, mapping in txn.hsets.items():
            pipe.hset(key, mapping=mapping)
        for key, field_, amount in txn.hincrs:
            pipe.hincrby(key, field_, amount)
        for key, minid in txn.trims.items():
            pipe.xtrim(key, minid=minid)
        for key, value in txn.rpushes:
            pipe.rpush(key, value)
        for key, value in txn.sadds:
            pipe.sadd(key, value)
        for key, fields in txn.hdels:
            pipe.hdel(key, *fields)
        for key in txn.deletes:
            pipe.delete(key)
