"""Decoding external input: the entries producers XADD to a redis_stream source's input streams.

A batch of entries becomes one Arrow table without a Python step per record: the entries' fields are
flattened into Arrow arrays (C loops), each column is gathered with one `take`, values are cast with
pyarrow.compute, JSON documents are parsed by pyarrow.json all at once, and an Arrow payload is already
columnar. Only records that fail are looked at one by one (they are dead-lettered one by one anyway;
casts.py, json_documents.py). The verdict on every record is the same whatever else its batch holds,
which the oracle relies on: it decodes the committed input again with this module and must drop
exactly the records the source dead-lettered.

Event time is the entry ID's time (when the record was XADDed) unless `eventTimeField` names a column;
`_ingest_ms`, the start of a record's latency, is always the entry ID's time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from streamjobs_core import ddl
from streamjobs_core.spec import RedisStreamSource

from .casts import cast
from .json_documents import read_documents

_NO_ROWS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Decoded:
    """A batch of entries as records: the good ones as a table, the bad ones with their reasons."""

    table: pa.Table | None  # declared (or string) columns, then event_time and _ingest_ms
    entry: np.ndarray  # per row of the table: index of its entry in the batch
    row: np.ndarray | None  # per row: its index in its entry's Arrow payload (format arrow only)
    bad: list[tuple[int, str, dict]]  # (entry index, error naming the field, the record as read)

    @property
    def records(self) -> int:
        """Records read, good and bad."""
        return (0 if self.table is None else self.table.num_rows) + len(self.bad)


def entry_ms(ids: list[bytes]) -> np.ndarray:
    """The time part of each stream entry ID (`<ms>-<seq>`)."""
    text = pa.array(ids, pa.binary()).cast(pa.string())
    return pc.cast(pc.list_element(pc.split_pattern(text, "-", max_splits=1), 0), pa.int64()).to_numpy()


class Decoder:
    """One source's decoding rules (format, schema, event time field), applied to a batch of entries."""

    def __init__(self, spec: RedisStreamSource) -> None:
        self._spec = spec
        self._schema = ddl.parse(spec.schema_) if spec.schema_ else None
        self._payload = spec.payload

    def decode(self, ids: list[bytes], fields: list) -> Decoded:
        """`fields`: each entry's fields as a flat [name, value, ...] list (a raw XREAD reply) or a dict
        (redis-py's parsed reply)."""
        if not ids:
            return Decoded(None, _NO_ROWS, None, [])
        flat = _Flat(fields)
        if self._spec.format == "arrow":
            return self._arrow(ids, flat)
        bad: dict[int, str] = {}
        if self._spec.format == "json":
            columns = self._json(flat, bad)
        else:
            columns = self._fields(flat, bad)
        ms = entry_ms(ids)
        entry = np.arange(len(ids))
        return self._finish(columns, ms, entry, None, bad, lambda i: flat.record(i))

    # --- formats -------------------------------------------------------------------

    def _fields(self, flat: _Flat, bad: dict[int, str]) -> dict[str, pa.Array]:
        if self._schema is None:
            names = sorted(flat.names())
            return {name: _text(flat.column(name)) for name in names}
        columns = {}
        for field in self._schema:
            raw = cast(flat.column(field.name), pa.string(), field.name, bad)
            columns[field.name] = cast(raw, field.type, field.name, bad)
        return columns

    def _json(self, flat: _Flat, bad: dict[int, str]) -> dict[str, pa.Array]:
        name = self._payload
        present, docs = flat.values_of(name)
        for i in flat.lacking(present):
            bad[i] = f"no field {name!r} (format json)"
        table, failed = read_documents(docs, self._schema)
        for i, error in failed.items():
            bad[int(present[i])] = error
        if table is None:
            return {f.name: pa.nulls(flat.entries, f.type) for f in self._schema}
        # The parsed documents' rows back at their entries' places (null where an entry has none).
        kept = np.delete(present, list(failed))
        at = np.full(flat.entries, -1, dtype=np.int64)
        at[kept] = np.arange(len(kept))
        take = pa.array(at, mask=at < 0)
        return {f.name: table.column(f.name).combine_chunks().take(take) for f in self._schema}

    def _arrow(self, ids: list[bytes], flat: _Flat) -> Decoded:
        name = self._payload
        present, payloads = flat.values_of(name)
        bad: list[tuple[int, str, dict]] = [(i, f"no field {name!r} (format arrow)", flat.record(i))
                                            for i in flat.lacking(present)]
        tables, entries = [], []
        for i, payload in zip(present.tolist(), payloads):  # per entry, each holding many records
            try:
                tables.append(pa.ipc.open_stream(pa.py_buffer(payload)).read_all())
                entries.append(i)
            except (pa.ArrowInvalid, OSError) as exc:
                bad.append((i, f"field {name!r}: not an Arrow IPC stream ({exc})", {name: f"<{len(payload)} bytes>"}))
        if not tables:
            return Decoded(None, _NO_ROWS, None, sorted(bad, key=lambda b: b[0]))
        sizes = np.array([t.num_rows for t in tables], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        source = np.repeat(np.arange(len(tables)), sizes)  # per row: its payload
        entry = np.array(entries, dtype=np.int64)[source]
        row = np.arange(len(entry)) - starts[source]
        row_bad: dict[int, str] = {}
        columns = _payload_columns(tables, starts, self._schema, row_bad)

        def record(r: int) -> dict:
            return _json_safe(tables[source[r]].slice(int(row[r]), 1).to_pylist()[0])

        decoded = self._finish(columns, entry_ms(ids)[entry], entry, row, row_bad, record)
        bad.extend((int(entry[r]), f"record {int(row[r])} of the entry: {error}", shown)
                   for r, error, shown in decoded.bad)
        return Decoded(decoded.table, decoded.entry, decoded.row, sorted(bad, key=lambda b: b[0]))

    # --- common ----------------------------------------------------------------------

    def _finish(self, columns: dict[str, pa.Array], ms: np.ndarray, entry: np.ndarray, row: np.ndarray | None,
                bad: dict[int, str], record) -> Decoded:
        """Event time, the table of the good rows and the bad rows' records. Indices in `bad` are rows."""
        n = len(ms)
        ingest = pa.array(ms, pa.int64())
        time_field = self._spec.event_time_field
        if time_field is None:
            event_time = ingest
        else:
            times: dict[int, str] = {}
            column = columns.get(time_field)
            if column is None:
                column = pa.nulls(n, pa.int64())
            event_time = cast(column, pa.int64(), time_field, times)
            for i in np.flatnonzero(event_time.is_null().to_numpy(zero_copy_only=False)):
                times.setdefault(int(i), f"field {time_field!r} is missing")
            for i, error in times.items():
                bad.setdefault(i, f"bad event time field: {error}")
        good = np.ones(n, dtype=bool)
        good[list(bad)] = False
        table = pa.table({**columns, "event_time": event_time, "_ingest_ms": ingest})
        if not good.all():
            table = table.filter(pa.array(good))
        bad_rows = [(i, error, record(i)) for i, error in sorted(bad.items())]
        return Decoded(table if table.num_rows else None, entry[good], None if row is None else row[good], bad_rows)


class _Flat:
    """The fields of a batch of entries, flattened: names and values of every pair, and whose entry it is."""

    def __init__(self, fields: list) -> None:
        self.entries = self._n = len(fields)
        if isinstance(fields[0], dict):  # a parsed reply (Redis Cluster): flatten the dicts in C
            pairs = list(chain.from_iterable(map(chain.from_iterable, map(dict.items, fields))))
            sizes = np.fromiter(map(len, fields), np.int64, self._n)
        else:
            pairs = list(chain.from_iterable(fields))
            sizes = np.fromiter(map(len, fields), np.int64, self._n) // 2
        self._names = pairs[0::2]
        self._values = pairs[1::2]
        self._name_array = pa.array(self._names, pa.binary())
        self._entry = np.repeat(np.arange(self._n), sizes)
        self._starts = np.cumsum(sizes) - sizes
        self._sizes = sizes

    def names(self) -> list[str]:
        return [name.decode("utf-8", "replace") for name in set(self._names)]

    def _positions(self, name: str) -> np.ndarray:
        """Per entry: the position of its (last) pair named `name`, -1 where it has none."""
        hit = np.flatnonzero(pc.equal(self._name_array, pa.scalar(name.encode(), pa.binary()))
                             .to_numpy(zero_copy_only=False))
        at = np.full(self._n, -1, dtype=np.int64)
        at[self._entry[hit]] = hit
        return at

    @cached_property
    def _value_array(self) -> pa.Array:
        return pa.array(self._values, pa.binary())  # only columns need it: payloads are not copied

    def column(self, name: str) -> pa.Array:
        """The values of field `name` as a binary array, null where an entry has no such field."""
        at = self._positions(name)
        return self._value_array.take(pa.array(at, mask=at < 0))

    def values_of(self, name: str) -> tuple[np.ndarray, list[bytes]]:
        """The entries that have field `name`, and its value in each of them."""
        at = self._positions(name)
        present = np.flatnonzero(at >= 0)
        return present, list(map(self._values.__getitem__, at[present].tolist()))

    def lacking(self, present: np.ndarray) -> list[int]:
        """The entries not among `present`."""
        lack = np.ones(self._n, dtype=bool)
        lack[present] = False
        return np.flatnonzero(lack).tolist()

    def record(self, i: int) -> dict:
        """Entry i's fields as text: what a dead letter shows."""
        lo, hi = self._starts[i], self._starts[i] + self._sizes[i]
        return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                for k, v in zip(self._names[lo:hi], self._values[lo:hi])}


def _text(values: pa.Array) -> pa.Array:
    """Strings as today's schemaless source gives them: undecodable bytes replaced, not refused."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()], pa.string())


def _payload_columns(tables: list[pa.Table], starts: np.ndarray, schema: pa.Schema,
                     bad: dict[int, str]) -> dict[str, pa.Array]:
    """The declared columns of all payloads one after the other, cast to their declared types (null where a
    payload lacks one); the rows that do not cast go to `bad`."""
    columns = {}
    for field in schema:
        parts = [t.column(field.name).combine_chunks() if field.name in t.column_names
                 else pa.nulls(t.num_rows, field.type) for t in tables]
        if all(part.type == parts[0].type for part in parts):
            columns[field.name] = cast(pa.concat_arrays(parts), field.type, field.name, bad)
            continue
        cast_parts = []  # payloads disagree on the column's type: cast each on its own
        for start, part in zip(starts.tolist(), parts):
            part_bad: dict[int, str] = {}
            cast_parts.append(cast(part, field.type, field.name, part_bad))
            bad.update({start + i: error for i, error in part_bad.items() if start + i not in bad})
        columns[field.name] = pa.concat_arrays(cast_parts)
    return columns


def _json_safe(record: dict) -> dict:
    return {k: v if v is None or isinstance(v, (str, int, float, bool)) else str(v) for k, v in record.items()}


def record_id(entry_id: bytes, row: int | None) -> bytes:
    """What names one record of an input stream: its entry's ID, and its row where an entry holds many."""
    return entry_id if row is None else b"%s/%d" % (entry_id, row)


class StreamReader:
    """XREAD of a source's streams with Redis's clock read just before, the reply left as Redis sent it:
    redis-py's parsing into a dict per entry would be a Python step per record. (Redis Cluster clients
    always parse; the decoder takes either form.)"""

    def __init__(self, r: redis.Redis | redis.RedisCluster) -> None:
        self._r = r
        self._raw = None
        if not isinstance(r, redis.RedisCluster):
            self._raw = redis.Redis(connection_pool=r.connection_pool)
            self._raw.set_response_callback("XREAD", lambda response, **_: response)

    def read(self, streams: dict[str, bytes], count: int, block_ms: int = 0) -> tuple[int, list]:
        """(Redis's time in ms before the read, [(stream name, [(entry ID, fields), ...]), ...])."""
        block = block_ms or None  # BLOCK 0 would wait forever
        if self._raw is None:
            seconds, micros = self._r.time()
            reply = self._r.xread(streams, count=count, block=block)
        else:
            pipe = self._raw.pipeline(transaction=False)
            pipe.time()
            pipe.xread(streams, count=count, block=block)
            (seconds, micros), reply = pipe.execute()
        if isinstance(reply, dict):  # RESP3 (redis-py's default from 8.0) sends a map of streams
            reply = list(reply.items())
        return seconds * 1000 + micros // 1000, reply or []
