"""The record streams in this process's memory: for a job whose workers are threads of one process."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .port import Entry, Fields, entry_order


@dataclass
class _Stream:
    orders: list[tuple[int, int]] = field(default_factory=list)  # sorted: entry ids as pairs
    entries: list[Entry] = field(default_factory=list)
    last: tuple[int, int] = (0, 0)  # the greatest id given, kept through trims as Redis keeps it

    def since(self, cursor: bytes | None) -> int:
        """Index of the first entry after `cursor`."""
        return 0 if cursor is None else bisect.bisect_right(self.orders, entry_order(cursor))

    def drop_first(self, n: int) -> None:
        del self.orders[:n], self.entries[:n]


def encoded(value: bytes | str | int | float) -> bytes:
    """A field as Redis keeps it: bytes (redis-py sends a str as UTF-8 and a number as its repr)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value).encode()
    raise TypeError(f"a stream field's value is bytes, str or a number, not {type(value).__name__}")


class MemoryStreams:
    """Every call holds one lock, so each is atomic as a Redis command is; a blocked read waits on it."""

    def __init__(self, clock_ms=lambda: int(time.time() * 1000), lock: threading.RLock | None = None) -> None:
        self._streams: dict[str, _Stream] = {}
        self._changed = threading.Condition(lock or threading.RLock())  # `lock`: shared with what fences commits
        self._clock_ms = clock_ms

    def append(self, stream: str, fields: Mapping[str | bytes, bytes | str | int | float],
               maxlen: int | None = None) -> bytes:
        with self._changed:
            return self._append(stream, fields, maxlen)

    def _append(self, stream: str, fields: Mapping, maxlen: int | None) -> bytes:
        """Under the lock."""
        if not fields:
            raise ValueError(f"an entry of {stream} needs at least one field")
        entry = {encoded(k): encoded(v) for k, v in fields.items()}
        s = self._streams.setdefault(stream, _Stream())
        ms = self._clock_ms()
        s.last = (ms, 0) if ms > s.last[0] else (s.last[0], s.last[1] + 1)
        entry_id = f"{s.last[0]}-{s.last[1]}".encode()
        s.orders.append(s.last)
        s.entries.append((entry_id, entry))
        if maxlen is not None and len(s.entries) > maxlen:
            s.drop_first(len(s.entries) - maxlen)
        self._changed.notify_all()
        return entry_id

    def read(self, cursors: Mapping[str, bytes], count: int, block_ms: int = 0) -> list[tuple[str, list[Entry]]]:
        if not cursors:
            return []
        deadline = time.monotonic() + block_ms / 1000
        with self._changed:
            while True:
                found = []
                for name, cursor in cursors.items():
                    s = self._streams.get(name)
                    if s is not None and (start := s.since(cursor)) < len(s.entries):
                        found.append((name, s.entries[start : start + count]))
                left = deadline - time.monotonic()
                if found or left <= 0:
                    return found
                self._changed.wait(left)

    def at(self, positions: Mapping[str, bytes]) -> dict[str, Fields | None]:
        found: dict[str, Fields | None] = {}
        with self._changed:
            for name, entry_id in positions.items():
                s = self._streams.get(name, _Stream())
                i = bisect.bisect_left(s.orders, entry_order(entry_id))
                found[name] = s.entries[i][1] if i < len(s.orders) and s.orders[i] == entry_order(entry_id) else None
        return found

    def after(self, positions: Mapping[str, bytes | None]) -> dict[str, list[Entry]]:
        with self._changed:
            return {name: s.entries[s.since(start):] for name, start in positions.items()
                    for s in (self._streams.get(name, _Stream()),)}

    def newest(self, streams: Sequence[str]) -> list[Entry | None]:
        with self._changed:
            return [s.entries[-1] if (s := self._streams.get(name)) is not None and s.entries else None
                    for name in streams]

    def trim(self, stream: str, before: bytes) -> int:
        with self._changed:
            return self._trim(stream, before)

    def _trim(self, stream: str, before: bytes | str) -> int:
        s = self._streams.get(stream)
        if s is None:
            return 0
        n = bisect.bisect_left(s.orders, entry_order(before))
        s.drop_first(n)
        return n

    def length(self, streams: Iterable[str]) -> list[int]:
        with self._changed:
            return [len(s.entries) if (s := self._streams.get(name)) is not None else 0 for name in streams]
