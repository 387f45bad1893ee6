"""A job's keys copied whole, and put back whole, each in one Redis script (savepoint.py says what for).

A script runs between two commands of any other client, so between two commits of any worker: the copy
is the job at one instant, and a reader of the restored job sees it before or after, never a mix. Both
scripts scan a pattern, so every key they touch must share the hash slot of the key that routes them
(a job's keys do: their hash tag). The scripts hold Redis for the time they take; a savepoint's size is
what it costs.
"""

from __future__ import annotations

import redis

_COPY = """
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return redis.error_reply('BUSY ' .. KEYS[i]) end
end
local skip = {}
for i = 3, #ARGV do skip[ARGV[i]] = true end
local copied, cursor = {}, '0'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    if not skip[key] and string.sub(key, 1, #ARGV[2]) ~= ARGV[2] then
      copied[#copied + 1] = key
      copied[#copied + 1] = redis.call('DUMP', key)
      copied[#copied + 1] = redis.call('PTTL', key)
    end
  end
until cursor == '0'
return {redis.call('GET', KEYS[1]), redis.call('HGETALL', KEYS[2]), copied}
"""

_REPLACE = """
local doomed, cursor = {}, '0'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    if string.sub(key, 1, #ARGV[2]) ~= ARGV[2] then doomed[#doomed + 1] = key end
  end
until cursor == '0'
for _, key in ipairs(doomed) do redis.call('DEL', key) end
local restored = 4 + 2 * tonumber(ARGV[4])
for i = 5, restored, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('SET', KEYS[1], ARGV[3])
for i = restored + 1, #ARGV, 3 do redis.call('RESTORE', ARGV[i], ARGV[i + 1], ARGV[i + 2], 'REPLACE') end
return #doomed
"""

Copied = list[tuple[str, int, bytes]]  # (key, ttl ms (0: none), DUMP payload)


class Busy(RuntimeError):
    """A key whose presence forbids the copy exists; `key` names it."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class Unreadable(RuntimeError):
    """This Redis cannot read a copied payload: an older Redis than the one that copied it."""


def copy(r: redis.Redis, read: str, read_hash: str, absent: list[str], pattern: str, spared: str,
         skip: list[str]) -> tuple[bytes | None, dict[bytes, bytes], Copied]:
    """String `read`'s value, hash `read_hash`'s fields, and every key matching `pattern` but those starting
    with `spared` or in `skip` as DUMP payloads; raises Busy if a key of `absent` exists."""
    try:
        value, fields, flat = r.eval(_COPY, 2 + len(absent), read, read_hash, *absent, pattern, spared, *skip)
    except redis.ResponseError as exc:
        if str(exc).startswith("BUSY "):
            raise Busy(str(exc).removeprefix("BUSY ")) from None
        raise
    return (value, dict(zip(fields[::2], fields[1::2])),
            [(flat[i].decode(), max(int(flat[i + 2]), 0), flat[i + 1]) for i in range(0, len(flat), 3)])


def replace(r: redis.Redis, string: tuple[str, bytes], hash_: tuple[str, dict[bytes, bytes]], pattern: str,
            spared: str, copied: Copied) -> int:
    """Delete every key matching `pattern` but those starting with `spared`, then write `string` (key, value)
    and `hash_` (key, fields) and restore `copied`; returns the keys deleted. The string's key routes the
    script."""
    fields = [item for field, value in hash_[1].items() for item in (field, value)]
    args = [item for key, ttl, payload in copied for item in (key, ttl, payload)]
    try:
        return int(r.eval(_REPLACE, 2, string[0], hash_[0], pattern, spared, string[1], len(hash_[1]), *fields,
                          *args))
    except redis.ResponseError as exc:
        if "payload version" in str(exc) or "checksum" in str(exc):
            raise Unreadable(str(exc)) from None
        raise
