"""The dead-letter stream's records: what an operator could not take, why, and where it came from.

Workers write them in the commit of the batch that met the record; the run report, the oracle and users
read them. A dead letter holds a preview of its record, bounded in bytes after its JSON escaping, and the
record's full size: never a multiple of the record (a 90 MB value of invalid UTF-8 escapes to ~6x that).
The entry ID names the original while the input's retention keeps it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .exchange import Exchange, Streams

PREVIEW_BYTES = 16 * 1024
ERROR_CHARS = 2000
_CUT = " ... [cut: {size:,} bytes in all]"


class Kind(StrEnum):
    UNDECODABLE = "undecodable"  # an input entry (or a record in it) that does not decode against its format
    OVERSIZE = "oversize"  # past one of the source's limits: not read or not decoded whole
    FUTURE = "future"  # stamped further ahead of its entry's time than the source's limits.maxFutureSkewMs
    REJECTED = "rejected"  # a stage failed on it alone (onError: dead_letter)
    LATE = "late"  # behind its key group's watermark: the window or join it belonged to had moved on
    QUARANTINED = "quarantined"  # a worker kept dying at it


_KINDS = {kind.value for kind in Kind}


@dataclass(frozen=True)
class DeadLetter:
    operator: str
    kind: Kind
    error: str  # why, naming the field, the bound or the window
    stream: str = ""  # the input stream it was read from, or `<upstream>><operator>` inside a chain
    entry_id: bytes = b""  # its entry in that stream, where it has one of its own
    record: str = ""  # a preview of the record as the operator met it (JSON, or the raw text)
    size: int = 0  # bytes of the record in full

    @classmethod
    def of(cls, operator: str, kind: Kind, error: str, record: Any = None, stream: str = "",
           entry_id: bytes = b"", size: int | None = None) -> DeadLetter:
        """A dead letter for `record` (a dict, a string or bytes), its preview bounded; `size`: the record's
        in full, where `record` is only a part of it."""
        text, size = preview(record, size=size)
        return cls(operator, kind, error[:ERROR_CHARS], stream, entry_id, text, size)

    def encode(self) -> dict[str, bytes | str]:
        return {"operator": self.operator, "kind": self.kind.value, "stream": self.stream, "id": self.entry_id,
                "error": self.error, "record": self.record, "size": str(self.size)}

    @classmethod
    def decode(cls, fields: dict[bytes, bytes]) -> DeadLetter:
        text = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in fields.items()}
        kind = text.get("kind", "")
        return cls(text.get("operator", ""), Kind(kind) if kind in _KINDS else Kind.REJECTED, text.get("error", ""),
                   text.get("stream", ""), fields.get(b"id", b""), text.get("record", ""),
                   int(text.get("size") or 0))

    @property
    def whole(self) -> bool:
        """Whether the preview holds the whole record."""
        return not self.record.endswith(_CUT.format(size=self.size))


def preview(record: Any, limit: int = PREVIEW_BYTES, size: int | None = None) -> tuple[str, int]:
    """(the record as text, at most `limit` UTF-8 bytes plus a note of what was cut; its size in full, or
    `size` where the record given is only a part).

    A dict is shown as JSON (non-text values as their str), bytes are decoded with replacement. Only the first
    `limit` bytes of a long record are ever escaped, so a huge one costs no more than its preview."""
    text, measured = _text(record, limit)
    full = measured if size is None else max(size, measured)
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= limit and full <= limit:
        return text, full
    return encoded[:limit].decode("utf-8", "ignore") + _CUT.format(size=full), full


def _text(record: Any, limit: int) -> tuple[str, int]:
    if record is None:
        return "", 0
    if isinstance(record, bytes):
        size = len(record)
        text = record[: limit + 4].decode("utf-8", "replace")
    elif isinstance(record, str):
        size = len(record.encode("utf-8", "replace")) if len(record) <= limit else len(record)
        text = record[: limit + 4]
    elif isinstance(record, dict):
        # Values cut before they are escaped, and no more fields than the preview can show: only what it
        # shows is ever copied.
        size = sum(_size(k) + _size(v) for k, v in record.items())
        shown, room = {}, limit
        for k, v in record.items():
            if room <= 0:
                break
            shown[str(k)[:limit]] = head = _head(v, limit)
            room -= len(str(k)) + (len(head) if isinstance(head, str) else 8)
        text = json.dumps(shown, default=str, ensure_ascii=False)
    else:
        text = json.dumps(record, default=str, ensure_ascii=False)
        size = len(text.encode("utf-8", "replace"))
    return text, size


def _size(value: Any) -> int:
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value)  # characters: a bound that costs no encoding of a huge value
    return len(str(value)) if value is not None else 4


def _head(value: Any, limit: int) -> Any:
    if isinstance(value, bytes):
        return value[: limit + 4].decode("utf-8", "replace")
    if isinstance(value, str):
        return value[: limit + 4]
    return value


def read_all(streams: Streams, stream: str) -> list[DeadLetter]:
    """Every dead letter the stream (a job's `dead_letter` key) still holds, oldest first."""
    return [DeadLetter.decode(fields) for _, fields in streams.after({stream: None})[stream]]


def totals(exchange: Exchange, key: str) -> dict[str, dict[str, int]]:
    """Per operator and kind: records dead-lettered, all time (the totals hash, `<op>:<kind>` fields)."""
    out: dict[str, dict[str, int]] = {}
    for field, count in exchange.hashes([key])[0].items():
        op, _, kind = field.decode().partition(":")
        if kind:
            out.setdefault(op, {})[kind] = int(count)
    return out
