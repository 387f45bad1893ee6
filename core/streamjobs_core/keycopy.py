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
for i = 2, #KEYS do
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
return {redis.call('GET', KEYS[1]), copied}
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
for i = 3, #ARGV, 3 do redis.call('RESTORE', ARGV[i], ARGV[i + 1], ARGV[i + 2], 'REPLACE') end
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


def copy(r: redis.Redis, read: str, absent: list[str], pattern: str, spared: str,
         skip: list[str]) -> tuple[bytes | None, Copied]:
    """`read`'s value and every key matching `pattern` but those starting with `spared` or in `skip`; raises
    Busy if a key of `absent` exists."""
    try:
        value, flat = r.eval(_COPY, 1 + len(absent), read, *absent, pattern, spared, *skip)
    except redis.ResponseError as exc:
        if str(exc).startswith("BUSY "):
            raise Busy(str(exc).removeprefix("BUSY ")) from None
        raise
    return value, [(flat[i].decode(), max(int(flat[i + 2]), 0), flat[i + 1]) for i in range(0, len(flat), 3)]


def replace(r: redis.Redis, route: str, pattern: str, spared: str, copied: Copied) -> int:
    """Delete every key matching `pattern` but those starting with `spared`, then restore `copied`; returns
    the keys deleted."""
    args = [item for key, ttl, payload in copied for item in (key, ttl, payload)]
    try:
        return int(r.eval(_REPLACE, 1, route, pattern, spared, *args))
    except redis.ResponseError as exc:
        if "payload version" in str(exc) or "checksum" in str(exc):
            raise Unreadable(str(exc)) from None
        raise
