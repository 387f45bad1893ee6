"""The record streams as Redis streams: one pipelined round trip per call."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import redis

from .port import Entry, Fields


class RedisStreams:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def append(self, stream: str, fields: Mapping[str | bytes, bytes | str | int | float],
               maxlen: int | None = None) -> bytes:
        return self.r.xadd(stream, dict(fields), maxlen=maxlen, approximate=True)

    def read(self, cursors: Mapping[str, bytes], count: int, block_ms: int = 0) -> list[tuple[str, list[Entry]]]:
        if not cursors:
            return []
        # redis-py's block=0 blocks for ever; None does not block.
        reply = self.r.xread(dict(cursors), count=count, block=block_ms or None)
        return [(name.decode() if isinstance(name, bytes) else name, entries) for name, entries in reply or ()]

    def at(self, positions: Mapping[str, bytes]) -> dict[str, Fields | None]:
        found = self._pipelined(lambda pipe, name: pipe.xrange(name, positions[name], positions[name]), positions)
        return {name: entries[0][1] if entries else None for name, entries in zip(positions, found)}

    def after(self, positions: Mapping[str, bytes | None]) -> dict[str, list[Entry]]:
        def queue(pipe, name):
            start = positions[name]
            pipe.xrange(name, min=b"-" if start is None else b"(" + start)

        return dict(zip(positions, self._pipelined(queue, positions)))

    def newest(self, streams: Sequence[str]) -> list[Entry | None]:
        found = self._pipelined(lambda pipe, name: pipe.xrevrange(name, count=1), streams)
        return [entries[0] if entries else None for entries in found]

    def trim(self, stream: str, before: bytes) -> int:
        return self.r.xtrim(stream, minid=before, approximate=False)

    def length(self, streams: Iterable[str]) -> list[int]:
        return self._pipelined(lambda pipe, name: pipe.xlen(name), list(streams))

    def _pipelined(self, queue, names: Iterable[str]) -> list:
        names = list(names)
        if not names:
            return []
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            queue(pipe, name)
        return pipe.execute()
