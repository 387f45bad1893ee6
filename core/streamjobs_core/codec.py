"""Entry encoding on kg streams: many records per XADD.

An entry has two fields: `m`, a msgpack header [records, watermark, runs], and
`d`, the records as one Arrow IPC stream (absent in a heartbeat). `runs` are the
producer's key groups (inclusive ranges) that the watermark speaks for.

A handover marker (Chi's control event) has one field, `h`: the instance that
owns the stream's key group after it. The rescale controller writes it; what
precedes it in the stream belongs to the old owner, what follows to the new one.

A reconfiguration barrier has one field, `c`: msgpack [version, runs]. A
producer writes it into every stream it feeds in the commit where it switched
to plan `version`; what it wrote there before was produced under the plan
before, what follows under `version` (reconfigure.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import pyarrow as pa


class DecodeError(ValueError):
    """An entry that is not a well-formed StreamJobs entry."""


@dataclass(frozen=True)
class Entry:
    records: int
    watermark: int
    runs: tuple[tuple[int, int], ...]
    table: pa.Table | None
    marker: int | None = None  # a handover marker's new owner; such an entry has no records
    barrier: int | None = None  # a reconfiguration barrier's plan version (with the producer's runs)


def encode_barrier(version: int, runs: list[tuple[int, int]]) -> dict[bytes, bytes]:
    return {b"c": msgpack.packb([version, runs])}


def encode_marker(target: int) -> dict[bytes, bytes]:
    return {b"h": msgpack.packb(target)}


def encode(table: pa.Table | None, watermark: int, runs: list[tuple[int, int]]) -> dict[bytes, bytes]:
    fields = {b"m": msgpack.packb([0 if table is None else table.num_rows, watermark, runs])}
    if table is not None:
        fields[b"d"] = encode_table(table)
    return fields


def decode(fields: dict[bytes, bytes]) -> Entry:
    try:
        if b"h" in fields:
            target = msgpack.unpackb(fields[b"h"])
            if not isinstance(target, int) or target < 0:
                raise DecodeError(f"a handover marker names an instance, not {target!r}")
            return Entry(0, 0, (), None, target)
        if b"c" in fields:
            version, runs = msgpack.unpackb(fields[b"c"], use_list=False)
            if not isinstance(version, int) or version < 1:
                raise DecodeError(f"a reconfiguration barrier names a plan version, not {version!r}")
            return Entry(0, 0, tuple((int(lo), int(hi)) for lo, hi in runs), None, barrier=version)
        records, watermark, runs = msgpack.unpackb(fields[b"m"], use_list=False)
        table = decode_table(fields[b"d"]) if b"d" in fields else None
        if not (isinstance(records, int) and isinstance(watermark, int)):
            raise DecodeError("header fields must be integers")
        return Entry(records, watermark, tuple((int(lo), int(hi)) for lo, hi in runs), table)
    except DecodeError:
        raise
    except Exception as exc:  # any malformed input is one kind of error to the caller
        raise DecodeError(f"undecodable entry: {exc}") from exc


def header(fields: dict[bytes, bytes]) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """A records entry's (records, watermark, runs), its records left undecoded."""
    try:
        records, watermark, runs = msgpack.unpackb(fields[b"m"], use_list=False)
        if not (isinstance(records, int) and isinstance(watermark, int)):
            raise DecodeError("header fields must be integers")
        return records, watermark, tuple((int(lo), int(hi)) for lo, hi in runs)
    except DecodeError:
        raise
    except Exception as exc:  # any malformed input is one kind of error to the caller
        raise DecodeError(f"undecodable entry header: {exc}") from exc


def encode_table(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_table(data: bytes) -> pa.Table:
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except Exception as exc:
        raise DecodeError(f"undecodable Arrow payload: {exc}") from exc
