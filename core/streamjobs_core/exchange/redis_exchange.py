"""The exchange in Redis: its record streams, and a batch's commit as one MULTI/EXEC in the job's slot,
WATCHing what fences it (the instance's incarnation, its operator's assignment)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgpack
import redis

from ..jobstore import RedisJobStore
from ..statelog import changelog_fields
from .commit import Fence, Transaction
from .redis_streams import RedisStreams

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


class RedisExchange(RedisStreams):
    def __init__(self, r: redis.Redis, jobs: RedisJobStore) -> None:
        super().__init__(r)
        self._jobs = jobs

    def commit(self, txn: Transaction, fence: Fence) -> dict[int, bytes]:
        if txn.in_commit:
            raise TypeError("a memory job store's records cannot commit to Redis: run the worker over one store")
        kgs = sorted(txn.changelog)
        while True:
            try:
                with self.r.pipeline(transaction=True) as pipe:
                    pipe.watch(*self._jobs.fencing_keys(fence.op, fence.instance))
                    fence.check(*self._jobs.fencing(pipe, fence.op, fence.instance))
                    pipe.multi()
                    queue(pipe, txn, lambda kg: self._jobs.keys.changelog(fence.op, kg))
                    results = pipe.execute()
                    return dict(zip(kgs, results[len(txn.xadds) : len(txn.xadds) + len(kgs)]))
            except redis.WatchError:
                continue  # the assignment was rewritten: the next try says whether that fences us

    def hashes(self, keys: Sequence[str]) -> list[dict[bytes, bytes]]:
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        return pipe.execute()

    def hash_fields(self, key: str, fields: list[str]) -> list[bytes | None]:
        return self.r.hmget(key, fields)

    def members(self, key: str) -> set[bytes]:
        return self.r.smembers(key)

    def items(self, key: str) -> list[bytes]:
        return self.r.lrange(key, 0, -1)

    def value(self, key: str) -> bytes | None:
        return self.r.get(key)


def apply(r: redis.Redis, txn: Transaction, changelog: Callable[[int], str]) -> list:
    """Apply the transaction unfenced, in one MULTI/EXEC: for tools that write state no worker owns (a bench's
    ballast, a test's setup). Workers commit through RedisExchange.commit."""
    pipe = r.pipeline(transaction=True)
    queue(pipe, txn, changelog)
    return pipe.execute()


def queue(pipe, txn: Transaction, changelog: Callable[[int], str]) -> None:
    """Add the transaction's commands to a pipeline: its appends first, then the changelog's (by key group,
    so their ids are found by position), then the rest."""
    for key, fields, maxlen in txn.xadds:
        pipe.xadd(key, fields, maxlen=maxlen, approximate=True)
    for kg in sorted(txn.changelog):
        pipe.xadd(changelog(kg), changelog_fields(txn.changelog[kg]))
    for rows in txn.rows:
        # EVAL, not EVALSHA: a script cache emptied by a restart or failover since it was loaded would fail
        # this one command inside EXEC while the others apply. The script's text is small beside its rows.
        pipe.execute_command("EVAL", _ADD_ROWS, 1, rows.key, len(rows.columns[0]),
                             "" if rows.maxlen is None else rows.maxlen, msgpack.packb(rows.names),
                             msgpack.packb(rows.columns))
    for key, value in txn.values.items():
        pipe.set(key, value)
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
