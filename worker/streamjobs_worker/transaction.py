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

import redis
from streamjobs_core.layout import JobKeys

from .recovery import changelog_fields


class Fenced(RuntimeError):
    """A newer incarnation of this instance, or a new assignment, exists: stop without committing."""


@dataclass
class Transaction:
    xadds: list[tuple[str, dict, int | None]] = field(default_factory=list)
    hsets: dict[str, dict] = field(default_factory=dict)
    hincrs: list[tuple[str, str, int]] = field(default_factory=list)
    trims: dict[str, bytes] = field(default_factory=dict)
    changelog: dict[int, list] = field(default_factory=dict)
    rpushes: list[tuple[str, str]] = field(default_factory=list)
    sadds: list[tuple[str, str]] = field(default_factory=list)
    after_commit: list[Callable[[], None]] = field(default_factory=list)

    def xadd(self, key: str, fields: dict, maxlen: int | None = None) -> None:
        self.xadds.append((key, fields, maxlen))

    def hset(self, key: str, mapping: dict) -> None:
        self.hsets.setdefault(key, {}).update(mapping)

    def hincrby(self, key: str, field_: str, amount: int) -> None:
        self.hincrs.append((key, field_, amount))

    @property
    def empty(self) -> bool:
        return not (self.xadds or self.hsets or self.hincrs or self.changelog or self.rpushes or self.sadds)


class Checkpoint:
    def __init__(self, r: redis.Redis, keys: JobKeys, op: str, instance: int, incarnation: int) -> None:
        self._r = r
        self._keys = keys
        self._op = op
        self._incarnation_key = keys.incarnation(op, instance)
        self._assignment_key = keys.assignment(op)
        self._incarnation = incarnation
        self._generation: bytes | None = None

    def commit(self, txn: Transaction) -> dict[int, bytes]:
        """Apply the transaction atomically; return the changelog entry id of every changed key group."""
        while True:
            try:
                results, kgs = self._try_commit(txn)
                break
            except redis.WatchError:
                continue  # the assignment was rewritten: the next try says whether that fences us
        changelog_ids = results[len(txn.xadds) : len(txn.xadds) + len(kgs)]
        for callback in txn.after_commit:
            callback()
        return dict(zip(kgs, changelog_ids))

    def _try_commit(self, txn: Transaction) -> tuple[list, list[int]]:
        with self._r.pipeline(transaction=True) as pipe:
            pipe.watch(self._incarnation_key, self._assignment_key)
            current = pipe.get(self._incarnation_key)
            generation, epoch = pipe.hmget(self._assignment_key, ["generation", "epoch"])
            generation = generation or epoch  # assignments written before generations existed
            if current is None or int(current) != self._incarnation:
                raise Fenced(f"incarnation {self._incarnation} superseded by {current!r}")
            if self._generation is None:
                self._generation = generation
            elif generation != self._generation:
                raise Fenced(f"assignment generation changed to {generation!r}: the key groups were reassigned")
            pipe.multi()
            for key, fields, maxlen in txn.xadds:
                pipe.xadd(key, fields, maxlen=maxlen, approximate=True)
            kgs = sorted(txn.changelog)
            for kg in kgs:
                pipe.xadd(self._keys.changelog(self._op, kg), changelog_fields(txn.changelog[kg]))
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
            return pipe.execute(), kgs
