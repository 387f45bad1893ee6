"""The record streams' port: what a worker reads and appends, whichever exchange keeps the entries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from .commit import Fence, Transaction

Fields = dict[bytes, bytes]
Entry = tuple[bytes, Fields]  # (entry id "<ms>-<seq>", fields), as Redis answers XRANGE


class Streams(Protocol):
    def append(self, stream: str, fields: Mapping[str | bytes, bytes | str | int | float],
               maxlen: int | None = None) -> bytes:
        """Add an entry under a new id, greater than every id the stream gave before (a trim
        included); keep at least the newest `maxlen` entries. Returns the id."""
    def read(self, cursors: Mapping[str, bytes], count: int, block_ms: int = 0) -> list[tuple[str, list[Entry]]]:
        """Up to `count` entries after each stream's cursor, in id order, for the streams that have any.
        With `block_ms`, waits until one of them has or the time passes (then []); 0 does not wait."""
    def at(self, positions: Mapping[str, bytes]) -> dict[str, Fields | None]:
        """Each stream's entry with the given id; None where it is not there (never added, or trimmed)."""
    def after(self, positions: Mapping[str, bytes | None]) -> dict[str, list[Entry]]:
        """Every entry of each stream after the given id (None: all of them), in id order."""
    def newest(self, streams: Sequence[str]) -> list[Entry | None]:
        """The last entry of each stream; None for an empty one."""
    def trim(self, stream: str, before: bytes) -> int:
        """Drop the entries with an id below `before`; how many went."""
    def length(self, streams: Iterable[str]) -> list[int]: ...


class Exchange(Streams, Protocol):
    def commit(self, txn: Transaction, fence: Fence) -> dict[int, bytes]:
        """Apply every write of `txn` at once, or none: Fenced when `fence` no longer holds. Returns the
        changelog entry id of each key group whose state changes it carried."""
    # What a commit wrote, as the job's readers (its store, reports, the oracle) see it.
    def hashes(self, keys: Sequence[str]) -> list[dict[bytes, bytes]]:
        """Whole hashes, read together (an edge's per-key-group counts, summed by its readers)."""
    def hash_fields(self, key: str, fields: list[str]) -> list[bytes | None]:
        """Some fields of a hash, in order (None where absent): what a reader of a few key groups asks."""
    def members(self, key: str) -> set[bytes]: ...
    def items(self, key: str) -> list[bytes]: ...
    def value(self, key: str) -> bytes | None: ...


def entry_order(entry_id: bytes | str) -> tuple[int, int]:
    """An entry id as the pair it is ordered by ("5-10" comes after "5-9"); a bare "<ms>" is "<ms>-0"."""
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


def next_entry(entry_id: bytes) -> bytes:
    """The smallest id after `entry_id`: where a trim that keeps everything after it starts."""
    ms, seq = entry_order(entry_id)
    return f"{ms}-{seq + 1}".encode()
