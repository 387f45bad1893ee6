"""Whatever a producer writes, decoding never raises: each entry becomes records or dead letters with a reason.

Property tests (hypothesis) feed arbitrary bytes and mutations of valid payloads to every decoder at the trust
boundary: a redis_stream source's formats (fields, json, arrow), an Arrow payload's framing check, the entry
codec of the streams between operators, and a dead letter's preview.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamjobs_core.codec import DecodeError, decode, encode
from streamjobs_core.deadletters import PREVIEW_BYTES, DeadLetter, Kind, preview
from streamjobs_core.loading import parse_job
from streamjobs_core.spec import MAX_EVENT_TIME
from streamjobs_worker import arrow_payload
from streamjobs_worker.external import Decoder, Oversize

SCHEMA = "user string, amount double, n int, t bigint"
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def source(**fields):
    job = parse_job({"metadata": {"name": "ext"}, "spec": {
        "sources": [{"name": "in", "type": "redis_stream", **fields}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["in"]}]}})
    return job.spec.sources[0]


DECODERS = {
    "fields": Decoder(source(schema=SCHEMA)),
    "fields-schemaless": Decoder(source()),
    "fields-event-time": Decoder(source(schema=SCHEMA, eventTimeField="t")),
    "json": Decoder(source(format="json", schema=SCHEMA, eventTimeField="t")),
    "arrow": Decoder(source(format="arrow", schema=SCHEMA, limits={"maxPayloadRows": 1000,
                                                                    "maxPayloadBytes": 1 << 20})),
}


def ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


VALID = ipc(pa.table({"user": ["a", "b"], "amount": [1.5, 2.0], "n": pa.array([1, 2], pa.int32()),
                      "t": [1_700_000_000_000, 1_700_000_000_001]}))
VALID_ZSTD = ipc(pa.table({"user": ["a"] * 50, "amount": [1.0] * 50}), "zstd")

ids = st.builds(lambda ms, seq: b"%d-%d" % (ms, seq), st.integers(1, 2**64 - 1), st.integers(0, 2**64 - 1))
values = st.one_of(st.binary(max_size=64), st.sampled_from([
    b"1.5", b"-0", b"NaN", b"1e309", b"99999999999999999999", b"\xff\xfe", b"", b"{}", b"[" * 2000,
    b'{"user": "a", "t": 1700000000000}', b'{"t": -9223372036854775808}', b'{"t": 9007199254740993}',
    b'{"user": ' + b"[" * 5000 + b"]" * 5000 + b"}", VALID, VALID_ZSTD, VALID[:-8], VALID + b"x",
]))
names = st.one_of(st.sampled_from([b"user", b"amount", b"n", b"t", b"data"]), st.binary(max_size=8))
entries = st.lists(st.lists(st.tuples(names, values), max_size=6).map(lambda pairs: [x for p in pairs for x in p]),
                   min_size=1, max_size=12)


def mutated(payload: bytes, data) -> bytes:
    """A valid payload with some bytes changed, cut or added."""
    raw = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    return bytes(raw[:cut]) + data.draw(st.binary(max_size=16))


@pytest.mark.parametrize("name", list(DECODERS))
@FAST
@given(data=st.data())
def test_no_entry_makes_a_decoder_raise(name, data):
    batch = data.draw(entries)
    entry_ids = data.draw(st.lists(ids, min_size=len(batch), max_size=len(batch)))
    if name in ("json", "arrow"):  # the payload field present, its value hostile
        batch = [[b"data", data.draw(values)] + fields for fields in batch]
    if name == "arrow" and data.draw(st.booleans()):
        batch[0] = [b"data", mutated(data.draw(st.sampled_from([VALID, VALID_ZSTD])), data)]
    decoded = DECODERS[name].decode(entry_ids, batch)
    present = set(decoded.entry.tolist()) | {bad.entry for bad in decoded.bad}
    if name != "arrow":  # an Arrow payload of no rows is an entry with no record
        assert present == set(range(len(batch)))
    for bad in decoded.bad:
        assert bad.error and isinstance(bad.kind, Kind)
    if decoded.table is not None:
        times = decoded.table.column("event_time").to_numpy()
        assert (np.abs(times) <= MAX_EVENT_TIME).all()  # nothing out of range moves a watermark


@FAST
@given(data=st.data())
def test_the_verdict_on_an_entry_does_not_depend_on_its_batch(data):
    """The oracle decodes a run's input at once; the source decoded it batch by batch."""
    decoder = DECODERS["fields-event-time"]
    batch = data.draw(entries)
    entry_ids = [b"%d-0" % (1_700_000_000_000 + i) for i in range(len(batch))]
    whole = decoder.decode(entry_ids, batch)
    alone = [decoder.decode([i], [fields]) for i, fields in zip(entry_ids, batch)]
    assert sorted(b.error for b in whole.bad) == sorted(b.error for d in alone for b in d.bad)
    rows = [d.table for d in alone if d.table is not None]
    assert (whole.table.num_rows if whole.table is not None else 0) == sum(t.num_rows for t in rows)


@FAST
@given(payload=st.binary(max_size=300))
def test_the_arrow_framing_check_refuses_any_bytes_with_a_reason(payload):
    try:
        arrow_payload.read(payload, 1000, 1 << 20)
    except arrow_payload.BadPayload as exc:
        assert str(exc)


@FAST
@given(data=st.data())
def test_a_mutated_arrow_payload_decodes_whole_or_is_refused(data):
    payload = mutated(data.draw(st.sampled_from([VALID, VALID_ZSTD])), data)
    try:
        table = arrow_payload.read(payload, 1000, 1 << 20)
    except arrow_payload.BadPayload:
        return
    table.validate(full=True)


def test_a_stream_cut_after_a_whole_batch_is_refused_not_read_in_part():
    table = pa.table({"n": list(range(20))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.slice(0, 10))
        first = sink.tell()
        writer.write_table(table.slice(10))
    whole = sink.getvalue().to_pybytes()
    assert arrow_payload.read(whole, 100, 1 << 20).num_rows == 20
    with pytest.raises(arrow_payload.BadPayload, match="without its end-of-stream marker"):
        arrow_payload.read(whole[:first], 100, 1 << 20)
    with pytest.raises(arrow_payload.BadPayload, match="after the end-of-stream marker"):
        arrow_payload.read(whole + b"\0" * 8, 100, 1 << 20)


def test_a_compression_bomb_is_refused_by_the_size_it_states_before_anything_is_decompressed():
    bomb = ipc(pa.table({"n": pa.array(np.zeros(2_000_000, dtype=np.int64))}), "zstd")
    assert len(bomb) < 64 * 1024
    with pytest.raises(arrow_payload.OverLimit, match="decodes to more than 1,048,576 bytes"):
        arrow_payload.inspect(bomb, 10_000_000, 1 << 20)
    with pytest.raises(arrow_payload.OverLimit, match="more than 1,000 rows"):
        arrow_payload.inspect(bomb, 1000, 1 << 30)
    decoded = DECODERS["arrow"].decode([b"1-0"], [[b"data", bomb]])
    assert decoded.table is None and decoded.bad[0].kind == Kind.OVERSIZE


def test_hostile_entries_each_become_a_dead_letter_naming_what_is_wrong():
    json_decoder, arrow_decoder = DECODERS["json"], DECODERS["arrow"]
    deep = b'{"user": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b', "t": 1700000000000}'
    decoded = json_decoder.decode([b"1700000000000-%d" % i for i in range(3)],
                                  [[b"data", deep], [b"data", b"{bad"], [b"data", b'{"user": "c", "t": 1700000000000}']])
    assert decoded.table.column("user").to_pylist() == ["a", "c"]  # a deep document is a document
    assert [b.entry for b in decoded.bad] == [1]
    twice = ipc(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["user", "user"]))
    decoded = arrow_decoder.decode([b"1-0"], [[b"data", twice]])
    assert "column 'user' more than once" in decoded.bad[0].error
    decoded = DECODERS["fields"].decode([b"18446744073709551615-0", b"5-0"], [[b"user", b"a"], [b"user", b"b"]])
    assert decoded.table.column("user").to_pylist() == ["b"]
    assert "its time is past 9007199254740992 ms" in decoded.bad[0].error
    decoded = DECODERS["fields-event-time"].decode(
        [b"1700000000000-0", b"1700000000000-1", b"1700000000000-2"],
        [[b"t", b"-9223372036854775808"], [b"t", b"1700003600000"], [b"t", b"1700000000100"]])
    assert decoded.table.column("t").to_pylist() == [1700000000100]
    kinds = {b.entry: (b.kind, b.error) for b in decoded.bad}
    assert kinds[0][0] == Kind.UNDECODABLE and "out of range" in kinds[0][1]
    assert kinds[1][0] == Kind.FUTURE and "3,600,000 ms ahead of its entry's time" in kinds[1][1]


def test_an_entry_over_the_size_limit_is_a_dead_letter_with_its_size_and_a_preview():
    decoded = DECODERS["fields"].decode([b"1-0"], [Oversize(90_000_000, [b"user", b"\xff" * 100])])
    [bad] = decoded.bad
    assert bad.kind == Kind.OVERSIZE and "90,000,000 bytes, over limits.maxEntryBytes" in bad.error
    letter = DeadLetter.of("in", bad.kind, bad.error, bad.record, "s", b"1-0", bad.size)
    assert letter.size == 90_000_000 and not letter.whole


@settings(max_examples=100, deadline=None)
@given(record=st.one_of(st.binary(max_size=40_000), st.text(max_size=40_000),
                        st.dictionaries(st.text(max_size=20), st.one_of(st.binary(max_size=30_000),
                                                                        st.text(max_size=30_000), st.integers()),
                                        max_size=30)))
def test_a_dead_letter_preview_is_bounded_and_says_what_it_cut(record):
    text, size = preview(record)
    assert len(text.encode()) <= PREVIEW_BYTES + 64
    letter = DeadLetter("op", Kind.REJECTED, "e", record=text, size=size)
    if letter.whole:
        assert isinstance(record, dict) or len(text.encode()) <= PREVIEW_BYTES
        if isinstance(record, dict):
            json.loads(text)


def test_a_huge_invalid_utf8_value_costs_only_its_preview():
    value = b"\xff" * (90 * 2**20)
    text, size = preview({"v": value})
    assert size == len(value) + 1 and len(text.encode()) < PREVIEW_BYTES + 64


@FAST
@given(fields=st.dictionaries(st.sampled_from([b"m", b"d", b"h", b"c", b"x"]), st.binary(max_size=80), max_size=4))
def test_an_entry_between_operators_decodes_or_says_it_cannot(fields):
    try:
        decode(fields)
    except DecodeError as exc:
        assert str(exc)


def test_an_entry_between_operators_round_trips():
    table = pa.table({"k": ["a", "b"]})
    entry = decode(encode(table, 42, [(0, 3)]))
    assert entry.table.equals(table) and entry.watermark == 42 and entry.runs == ((0, 3),)
