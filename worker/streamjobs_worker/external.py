"""Decoding external input: the entries producers XADD to a redis_stream source's input streams.

A batch of entries becomes one Arrow table without a Python step per record: the entries' fields are
flattened into Arrow arrays (C loops), each column is gathered with one `take`, values are cast with
pyarrow.compute, JSON documents are parsed by pyarrow.json all at once, and an Arrow payload is already
columnar. Only records that fail are looked at one by one (they are dead-lettered one by one anyway;
casts.py, json_documents.py). The verdict on every record is the same whatever else its batch holds,
which the oracle relies on: it decodes the committed input again with this module and must drop
exactly the records the source dead-lettered.

Producers are not trusted. Entries are read with a bound on their size (`StreamReader`: one past
`limits.maxEntryBytes` arrives as its size and a preview, never whole), an Arrow payload decodes only
once its framing proved it whole and within the limits (arrow_payload.py), an event time must lie in
range and not too far ahead of its entry's time, and whatever a check did not foresee raises inside
`Decoder.decode`'s guard: the batch is then halved until the entry that raises stands alone, and that
entry is dead-lettered with the error, the rest decoded as usual (the verdict still depends on the entry
alone). Nothing a producer writes makes `decode` raise.

Event time is the entry ID's time (when the record was XADDed) unless `eventTimeField` names a column;
`_ingest_ms`, the start of a record's latency, is always the entry ID's time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from streamjobs_core import ddl
from streamjobs_core.deadletters import PREVIEW_BYTES, Kind
from streamjobs_core.spec import MAX_EVENT_TIME, MIN_EVENT_TIME, RedisStreamSource

from . import arrow_payload
from .casts import cast
from .json_documents import read_documents

_NO_ROWS = np.zeros(0, dtype=np.int64)
_RESERVED = ("event_time", "_ingest_ms")


@dataclass(frozen=True)
class Oversize:
    """An entry past `limits.maxEntryBytes` as the bounded read returns it: its size, and its first fields
    cut to a preview (the entry itself never leaves Redis)."""

    size: int
    shown: list[bytes]  # names and values, alternating

    def record(self) -> dict:
        return _named(self.shown[0::2], self.shown[1::2])


class Bad(NamedTuple):
    """A record (or a whole entry) the source cannot take: dead-lettered with `error`, naming the field or bound."""

    entry: int  # index of its entry in the batch
    kind: Kind
    error: str
    record: dict  # as read (values as sent, not copied), for the dead letter's preview
    size: int | None = None  # bytes of the record in full, where `record` is only its head


@dataclass(frozen=True)
class Decoded:
    """A batch of entries as records: the good ones as a table, the bad ones with their reasons."""

    table: pa.Table | None  # declared (or string) columns, then event_time and _ingest_ms
    entry: np.ndarray  # per row of the table: index of its entry in the batch
    row: np.ndarray | None  # per row: its index in its entry's Arrow payload (format arrow only)
    bad: list[Bad]

    @property
    def records(self) -> int:
        """Records read, good and bad."""
        return (0 if self.table is None else self.table.num_rows) + len(self.bad)

    def remapped(self, entries: np.ndarray) -> Decoded:
        """This decoding of the entries `entries` of a larger batch, its indices made the batch's."""
        return Decoded(self.table, entries[self.entry], self.row,
                       [bad._replace(entry=int(entries[bad.entry])) for bad in self.bad])


_NOTHING = Decoded(None, _NO_ROWS, None, [])


def entry_times(ids: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The time part of each stream entry ID (`<ms>-<seq>`) as int64, and whether it is past MAX_EVENT_TIME
    (an ID written explicitly, up to 2^64 - 1: it has no event time; its time is given as -1)."""
    text = pa.array(ids, pa.binary()).cast(pa.string())
    ms = pc.cast(pc.list_element(pc.split_pattern(text, "-", max_splits=1), 0), pa.uint64()).to_numpy()
    beyond = ms > MAX_EVENT_TIME
    return np.where(beyond, -1, ms).astype(np.int64), beyond


class Decoder:
    """One source's decoding rules (format, schema, event time field, limits), applied to a batch of entries."""

    def __init__(self, spec: RedisStreamSource) -> None:
        self._spec = spec
        self._schema = ddl.parse(spec.schema_) if spec.schema_ else None
        self._payload = spec.payload
        self._limits = spec.limits

    def decode(self, ids: list[bytes], fields: list) -> Decoded:
        """`fields`: each entry's fields as a flat [name, value, ...] list (a raw reply), a dict (redis-py's
        parsed reply) or an `Oversize` (the bounded read's stand-in for an entry past the size limit)."""
        if not ids:
            return _NOTHING
        ms, beyond = entry_times(ids)
        bad: list[Bad] = []
        good: list[int] = []
        for i, entry in enumerate(fields):
            if isinstance(entry, Oversize):
                bad.append(Bad(i, Kind.OVERSIZE, f"an entry of {entry.size:,} bytes, over limits.maxEntryBytes "
                                                  f"({self._limits.max_entry_bytes:,}): not read", entry.record(),
                               entry.size))
            elif beyond[i]:
                bad.append(Bad(i, Kind.UNDECODABLE, f"entry ID {ids[i].decode(errors='replace')}: its time is past "
                                                     f"{MAX_EVENT_TIME} ms, out of the range of event times",
                               fields_of(entry)))
            else:
                good.append(i)
        decoded = self._guarded(np.array(good, dtype=np.int64), ids, fields, ms) if good else _NOTHING
        if not bad:
            return decoded
        return Decoded(decoded.table, decoded.entry, decoded.row, sorted(decoded.bad + bad, key=lambda b: b.entry))

    def _guarded(self, entries: np.ndarray, ids: list[bytes], fields: list, ms: np.ndarray) -> Decoded:
        """The entries decoded; where that raises, each half on its own, down to the entry that raises, which
        is dead-lettered with the error (what no check foresaw is still one entry's fault)."""
        try:
            return self._decode([ids[i] for i in entries.tolist()], [fields[i] for i in entries.tolist()],
                                ms[entries]).remapped(entries)
        except Exception as exc:  # noqa: BLE001 - the trust boundary: anything a producer's entry raises
            if len(entries) == 1:
                i = int(entries[0])
                error = f"does not decode ({type(exc).__name__}: {str(exc)[:500]})"
                return Decoded(None, _NO_ROWS, None, [Bad(i, Kind.UNDECODABLE, error, fields_of(fields[i]))])
            half = len(entries) // 2
            return _joined(self._guarded(entries[:half], ids, fields, ms),
                           self._guarded(entries[half:], ids, fields, ms))

    def _decode(self, ids: list[bytes], fields: list, ms: np.ndarray) -> Decoded:
        flat = _Flat(fields)
        if self._spec.format == "arrow":
            return self._arrow(flat, ms)
        bad: dict[int, tuple[Kind, str]] = {}
        if self._spec.format == "json":
            columns = self._json(flat, bad)
        else:
            columns = self._fields(flat, bad)
        return self._finish(columns, ms, np.arange(len(ids)), None, bad, flat.record)

    # --- formats -------------------------------------------------------------------

    def _fields(self, flat: _Flat, bad: dict[int, tuple[Kind, str]]) -> dict[str, pa.Array]:
        if self._schema is None:
            names = sorted(flat.names())
            return {name: _text(flat.column(name)) for name in names}
        columns = {}
        for field in self._schema:
            errors: dict[int, str] = {}
            raw = cast(flat.column(field.name), pa.string(), field.name, errors)
            columns[field.name] = cast(raw, field.type, field.name, errors)
            _add(bad, errors, Kind.UNDECODABLE)
        return columns

    def _json(self, flat: _Flat, bad: dict[int, tuple[Kind, str]]) -> dict[str, pa.Array]:
        name = self._payload
        present, docs = flat.values_of(name)
        for i in flat.lacking(present):
            bad[i] = (Kind.UNDECODABLE, f"no field {name!r} (format json)")
        table, failed = read_documents(docs, self._schema)
        for i, error in failed.items():
            bad[int(present[i])] = (Kind.UNDECODABLE, error)
        if table is None:
            return {f.name: pa.nulls(flat.entries, f.type) for f in self._schema}
        # The parsed documents' rows back at their entries' places (null where an entry has none).
        kept = np.delete(present, list(failed))
        at = np.full(flat.entries, -1, dtype=np.int64)
        at[kept] = np.arange(len(kept))
        take = pa.array(at, mask=at < 0)
        return {f.name: table.column(f.name).combine_chunks().take(take) for f in self._schema}

    def _arrow(self, flat: _Flat, ms: np.ndarray) -> Decoded:
        name = self._payload
        present, payloads = flat.values_of(name)
        bad = [Bad(i, Kind.UNDECODABLE, f"no field {name!r} (format arrow)", flat.record(i))
               for i in flat.lacking(present)]
        limits = self._limits
        tables, entries = [], []
        for i, payload in zip(present.tolist(), payloads):  # per entry, each holding many records
            try:
                tables.append(arrow_payload.read(payload, limits.max_payload_rows, limits.max_payload_bytes))
                entries.append(i)
            except arrow_payload.BadPayload as exc:
                kind = Kind.OVERSIZE if isinstance(exc, arrow_payload.OverLimit) else Kind.UNDECODABLE
                bad.append(Bad(i, kind, f"field {name!r}: {exc}", {name: f"<{len(payload):,} bytes>"}))
        if not tables:
            return Decoded(None, _NO_ROWS, None, sorted(bad, key=lambda b: b.entry))
        sizes = np.array([t.num_rows for t in tables], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        source = np.repeat(np.arange(len(tables)), sizes)  # per row: its payload
        entry = np.array(entries, dtype=np.int64)[source]
        row = np.arange(len(entry)) - starts[source]
        row_bad: dict[int, str] = {}
        columns = _payload_columns(tables, starts, self._schema, row_bad)

        def record(r: int) -> dict:
            return _json_safe(tables[source[r]].slice(int(row[r]), 1).to_pylist()[0])

        decoded = self._finish(columns, ms[entry], entry, row, {r: (Kind.UNDECODABLE, e) for r, e in row_bad.items()},
                               record)
        bad.extend(Bad(int(entry[b.entry]), b.kind, f"record {int(row[b.entry])} of the entry: {b.error}", b.record)
                   for b in decoded.bad)
        return Decoded(decoded.table, decoded.entry, decoded.row, sorted(bad, key=lambda b: b.entry))

    # --- common ----------------------------------------------------------------------

    def _finish(self, columns: dict[str, pa.Array], ms: np.ndarray, entry: np.ndarray, row: np.ndarray | None,
                bad: dict[int, tuple[Kind, str]], record) -> Decoded:
        """Event time, the table of the good rows and the bad rows' records. Indices in `bad` are rows (and
        in the returned Decoded too, for the caller to map)."""
        n = len(ms)
        ingest = pa.array(ms, pa.int64())
        time_field = self._spec.event_time_field
        if time_field is None:
            event_time = ingest
        else:
            event_time = self._event_time(columns.get(time_field), ms, bad)
        good = np.ones(n, dtype=bool)
        good[list(bad)] = False
        table = pa.table({**columns, "event_time": event_time, "_ingest_ms": ingest})
        if not good.all():
            table = table.filter(pa.array(good))
        bad_rows = [Bad(i, kind, error, record(i)) for i, (kind, error) in sorted(bad.items())]
        return Decoded(table if table.num_rows else None, entry[good], None if row is None else row[good], bad_rows)

    def _event_time(self, column: pa.Array | None, ms: np.ndarray, bad: dict[int, tuple[Kind, str]]) -> pa.Array:
        """The event time field as int64, each row that has none, or one out of range or too far ahead of its
        entry's time, in `bad`: such a record would move the watermark where no other record can follow."""
        name = self._spec.event_time_field
        errors: dict[int, str] = {}
        event_time = cast(pa.nulls(len(ms), pa.int64()) if column is None else column, pa.int64(), name, errors)
        for i in np.flatnonzero(event_time.is_null().to_numpy(zero_copy_only=False)):
            errors.setdefault(int(i), f"field {name!r} is missing")
        _add(bad, {i: f"bad event time field: {e}" for i, e in errors.items()}, Kind.UNDECODABLE)
        times = event_time.fill_null(0).to_numpy()
        in_range = np.clip(times, MIN_EVENT_TIME, MAX_EVENT_TIME)
        for i in np.flatnonzero(in_range != times).tolist():
            bad.setdefault(i, (Kind.UNDECODABLE, f"field {name!r}: event time {times[i]} is out of range "
                                                 f"(+-2^53 ms around 1970)"))
        skew = self._spec.limits.max_future_skew_ms
        if skew is not None:
            for i in np.flatnonzero(in_range - ms > skew).tolist():
                bad.setdefault(i, (Kind.FUTURE, f"field {name!r}: event time {times[i]} is {times[i] - ms[i]:,} ms "
                                                f"ahead of its entry's time {ms[i]} (limits.maxFutureSkewMs {skew:,})"))
        return event_time


def _add(bad: dict[int, tuple[Kind, str]], errors: dict[int, str], kind: Kind) -> None:
    for i, error in errors.items():
        bad.setdefault(i, (kind, error))


def _joined(first: Decoded, second: Decoded) -> Decoded:
    """Two decodings of consecutive parts of a batch, as one."""
    tables = [d.table for d in (first, second) if d.table is not None]
    table = None
    if tables:
        table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        # Schemaless parts may hold different fields: in the order one batch would give them.
        names = sorted(n for n in table.column_names if n not in _RESERVED)
        table = table.select([*names, *_RESERVED])
    rows = [d.row for d in (first, second) if d.table is not None]
    row = np.concatenate(rows) if rows and rows[0] is not None else None
    return Decoded(table, np.concatenate([first.entry, second.entry]), row, first.bad + second.bad)


def fields_of(entry: list | dict) -> dict:
    """One entry's fields by name, values as sent (for a dead letter's preview)."""
    return _Flat([entry]).record(0)


class _Flat:
    """The fields of a batch of entries, flattened: names and values of every pair, and whose entry it is."""

    def __init__(self, fields: list) -> None:
        self.entries = self._n = len(fields)
        if self._n and isinstance(fields[0], dict):  # a parsed reply (Redis Cluster): flatten the dicts in C
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
        """Entry i's fields, each cut to what a dead letter's preview can show (a value may be huge)."""
        lo, hi = self._starts[i], self._starts[i] + self._sizes[i]
        return _named(self._names[lo:hi], self._values[lo:hi])


def _named(names: list, values: list) -> dict:
    """Fields by name (as text) with their values as sent: a dead letter copies only the head of a value."""
    return {name[:PREVIEW_BYTES].decode("utf-8", "replace") if isinstance(name, bytes) else str(name): value
            for name, value in zip(names, values)}


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


# Reads entries after a cursor (up to `last`) of each stream, `count` per stream at most, in one round trip
# with Redis's clock: an entry past the entry limit comes back as {id, size, its first fields cut} (and its
# stream's flag says it holds one), and the read stops before the entry that would take the batch past the
# byte budget (the first always fits). XRANGE's exclusive start needs Redis 6.2; no ID follows the largest.
# Entries go back as XRANGE gave them where nothing was cut: the script's cost is Lua's copy of the reply.
_BOUNDED_READ = """
local count, max_entry, budget, shown = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = redis.call('TIME')
local reply = {now[1], now[2], 0}
local total = 0
for i, key in ipairs(KEYS) do
  local after, last = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local entries = {}
  if after ~= '18446744073709551615-18446744073709551615' then
    entries = redis.call('XRANGE', key, '(' .. after, last, 'COUNT', count)
  end
  local out, stubs = nil, 0
  for n, entry in ipairs(entries) do
    local fields, size = entry[2], 0
    for j = 1, #fields do size = size + #fields[j] end
    if size > max_entry then
      local cut = {}
      for j = 1, math.min(#fields, 16) do cut[j] = string.sub(fields[j], 1, shown) end
      entries[n] = {entry[1], size, cut}
      stubs = 1
    elseif total > 0 and total + size > budget then
      out = {}
      for m = 1, n - 1 do out[m] = entries[m] end
      reply[3] = 1
      break
    else
      total = total + size
    end
  end
  reply[#reply + 1] = {key, out or entries, stubs}
  if reply[3] == 1 then break end
end
return reply
"""


@dataclass(frozen=True)
class Read:
    server_ms: int  # Redis's clock just before the read
    streams: list[tuple[bytes, list[tuple[bytes, list | Oversize]]]]  # per stream read: its entries
    cut: bool  # the byte budget ended the read before every entry asked for


class StreamReader:
    """Bounded reads of a source's input streams (`_BOUNDED_READ`): what a producer writes can make an entry
    a dead letter, never a worker's memory. An idle source blocks on XREAD of one entry per stream (Redis has
    no blocking read that returns less) and then reads as usual."""

    def __init__(self, r: redis.Redis | redis.RedisCluster, max_entry_bytes: int, max_bytes: int) -> None:
        self._r = r
        self._script = r.register_script(_BOUNDED_READ)
        self._max_entry = max_entry_bytes
        self._budget = max_bytes

    def read(self, streams: dict[str, bytes], count: int, block_ms: int = 0) -> Read:
        """Entries after each stream's cursor; `block_ms` > 0 waits that long for a first one."""
        read = self.range({name: (cursor, "+") for name, cursor in streams.items()}, count)
        if block_ms and not any(entries for _, entries in read.streams):
            if self._r.xread(streams, count=1, block=block_ms):
                read = self.range({name: (cursor, "+") for name, cursor in streams.items()}, count)
        return read

    def range(self, bounds: dict[str, tuple[bytes | str, bytes | str]], count: int) -> Read:
        """Entries after `after` and up to `last` (inclusive) of each stream, by `bounds[stream]`."""
        args: list = [count, self._max_entry, self._budget, PREVIEW_BYTES]
        for after, last in bounds.values():
            args.extend((after, last))
        seconds, micros, cut, *streams = self._script(keys=list(bounds), args=args)
        return Read(int(seconds) * 1000 + int(micros) // 1000,
                    [(name, [_entry(e) for e in entries] if stubs else entries) for name, entries, stubs in streams],
                    bool(cut))


def _entry(reply: list) -> tuple[bytes, list | Oversize]:
    if len(reply) == 3:
        entry_id, size, shown = reply
        return entry_id, Oversize(int(size), list(shown))
    return reply[0], reply[1]
