"""An external Arrow IPC payload checked before it is decoded: whole, and within the source's limits.

pyarrow reads a stream cut after a whole record batch as if it had ended there (the rest of the records
silently gone), and decompresses whatever a buffer claims (31 KB of zstd asked for 1 GB). So the payload's
framing is walked first, without decoding anything: every message's metadata (a flatbuffer, read here with
bounds checks at every step) gives its rows and its buffers, and a compressed buffer states its size in
full in its first 8 bytes. A payload decodes only when it ends with the end-of-stream marker exactly, and
its rows and decoded bytes are within the limits; anything else is refused with the reason.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

_CONTINUATION = 0xFFFFFFFF
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3  # MessageHeader, Message.fbs


class BadPayload(ValueError):
    """A payload that is not one whole Arrow IPC stream; the message says why."""


class OverLimit(BadPayload):
    """A payload that would decode to more rows or bytes than the source's limits allow."""


@dataclass(frozen=True)
class Shape:
    rows: int
    decoded_bytes: int  # of every buffer, decompressed


def read(payload: bytes, max_rows: int, max_bytes: int) -> pa.Table:
    """The payload's records, once its shape was checked (`inspect`) and its data validated in full."""
    inspect(payload, max_rows, max_bytes)
    try:
        table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
        table.validate(full=True)  # offsets, lengths, UTF-8: what a stage would otherwise trip over
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise BadPayload(f"not a valid Arrow IPC stream ({exc})") from exc
    names = table.column_names
    if len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise BadPayload(f"the payload has column {twice[0]!r} more than once")
    return table


def inspect(payload: bytes, max_rows: int, max_bytes: int) -> Shape:
    """The payload's rows and decoded size, from its framing alone; BadPayload if it is not one whole stream
    (cut short, bytes after its end, a message out of bounds) or passes a limit."""
    view = memoryview(payload)
    size = len(view)
    pos = rows = decoded = 0
    schema = False
    while True:
        if pos + 8 > size:
            raise BadPayload(f"the stream ends at byte {size} without its end-of-stream marker (cut short?)")
        continuation, length = struct.unpack_from("<Ii", view, pos)
        if continuation != _CONTINUATION:
            raise BadPayload(f"no Arrow IPC message at byte {pos}")
        pos += 8
        if length == 0:
            break
        if length < 0 or pos + length > size:
            raise BadPayload(f"a message's metadata runs past the end of the payload (byte {pos})")
        try:
            kind, body_length, batch = _message(view[pos : pos + length])
        except (struct.error, IndexError, ValueError) as exc:
            raise BadPayload(f"a message's metadata does not parse (byte {pos}: {exc})") from None
        pos += length
        if body_length < 0 or pos + body_length > size:
            raise BadPayload(f"a message's body runs past the end of the payload (byte {pos})")
        if kind == _SCHEMA:
            schema = True
        elif kind in (_DICTIONARY_BATCH, _RECORD_BATCH) and schema and batch is not None:
            batch_rows, compressed, buffers = batch
            if kind == _RECORD_BATCH:
                rows += batch_rows
            decoded += _decoded_bytes(view[pos : pos + body_length], compressed, buffers)
        else:
            raise BadPayload(f"unexpected Arrow IPC message (type {kind}) at byte {pos - length}")
        pos += body_length
        if rows > max_rows:
            raise OverLimit(f"more than {max_rows:,} rows (limits.maxPayloadRows)")
        if decoded > max_bytes:
            raise OverLimit(f"decodes to more than {max_bytes:,} bytes (limits.maxPayloadBytes)")
    if pos != size:
        raise BadPayload(f"{size - pos} bytes after the end-of-stream marker")
    if not schema:
        raise BadPayload("the stream has no schema")
    return Shape(rows, decoded)


def _decoded_bytes(body: memoryview, compressed: bool, buffers: list[tuple[int, int]]) -> int:
    total = 0
    for offset, length in buffers:
        if offset < 0 or length < 0 or offset + length > len(body):
            raise BadPayload("a buffer lies outside its message's body")
        if compressed and length >= 8:
            (full,) = struct.unpack_from("<q", body, offset)
            if full < -1:
                raise BadPayload("a compressed buffer states a negative size")
            total += length - 8 if full == -1 else full  # -1: stored uncompressed
        else:
            total += length
    return total


def _message(meta: memoryview) -> tuple[int, int, tuple[int, bool, list[tuple[int, int]]] | None]:
    """(header type, body length, (rows, compressed, buffers) of a batch) from a Message flatbuffer."""
    message = _Table.root(meta)
    kind = message.scalar(1, "<B", 0)
    body_length = message.scalar(3, "<q", 0)
    header = message.table(2)
    if kind == _DICTIONARY_BATCH and header is not None:
        header = header.table(1)  # DictionaryBatch.data: a RecordBatch
    if kind not in (_DICTIONARY_BATCH, _RECORD_BATCH) or header is None:
        return kind, body_length, None
    rows = header.scalar(0, "<q", 0)
    if rows < 0:
        raise ValueError("a negative row count")
    buffers = [struct.unpack_from("<qq", meta, at) for at in header.structs(2, 16)]
    return kind, body_length, (rows, header.table(3) is not None, buffers)


class _Table:
    """A flatbuffer table: fields found through its vtable; every read checked against the buffer's end."""

    def __init__(self, buf: memoryview, pos: int) -> None:
        if not 0 <= pos <= len(buf) - 4:
            raise ValueError("a table out of bounds")
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        if not 0 <= self.vtable <= len(buf) - 4:
            raise ValueError("a vtable out of bounds")
        self.vtable_size = struct.unpack_from("<H", buf, self.vtable)[0]

    @classmethod
    def root(cls, buf: memoryview) -> _Table:
        return cls(buf, struct.unpack_from("<I", buf, 0)[0])

    def _offset(self, field: int) -> int:
        slot = 4 + 2 * field
        if slot + 2 > self.vtable_size:
            return 0
        return struct.unpack_from("<H", self.buf, self.vtable + slot)[0]

    def scalar(self, field: int, fmt: str, default: int) -> int:
        offset = self._offset(field)
        return struct.unpack_from(fmt, self.buf, self.pos + offset)[0] if offset else default

    def _target(self, field: int) -> int | None:
        offset = self._offset(field)
        if not offset:
            return None
        at = self.pos + offset
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def table(self, field: int) -> _Table | None:
        at = self._target(field)
        return None if at is None else _Table(self.buf, at)

    def structs(self, field: int, width: int) -> list[int]:
        """The positions of a vector of fixed-size structs."""
        at = self._target(field)
        if at is None:
            return []
        count = struct.unpack_from("<I", self.buf, at)[0]
        if at + 4 + count * width > len(self.buf):
            raise ValueError("a vector runs past the metadata")
        return [at + 4 + i * width for i in range(count)]
