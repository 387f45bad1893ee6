"""Entry encoding on kg streams: msgpack header plus an Arrow IPC payload."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import msgpack
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamjobs_core.codec import DecodeError, Entry, decode, decode_table, encode, encode_marker, encode_table

pytestmark = pytest.mark.unit


def mixed_table() -> pa.Table:
    return pa.table(
        {
            "i64": pa.array([1, -2, None, 2**62], pa.int64()),
            "i32": pa.array([0, 1, 2, 3], pa.int32()),
            "f": pa.array([1.5, float("inf"), None, -0.0]),
            "s": pa.array(["a", "", None, "日本"]),
            "b": pa.array([True, False, None, True]),
            "bin": pa.array([b"\x00\xff", b"", None, b"x"]),
            "ts": pa.array([0, 1_700_000_000_000, None, -1], pa.timestamp("ms")),
            "d": pa.array([dt.date(2024, 1, 1), None, dt.date(1970, 1, 1), dt.date(2000, 2, 29)]),
            "dec": pa.array([Decimal("1.25"), None, Decimal("-3.50"), Decimal("0.00")], pa.decimal128(10, 2)),
            "lst": pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64())),
            "st": pa.array([{"x": 1, "y": "a"}, None, {"x": None, "y": "b"}, {"x": 4, "y": None}]),
            "dict": pa.array(["p", "q", "p", None]).dictionary_encode(),
        }
    )


def test_round_trip_of_a_table_with_many_column_types() -> None:
    table = mixed_table().replace_schema_metadata({b"origin": b"test"})
    fields = encode(table, 12345, [(0, 3), (7, 7)])
    assert set(fields) == {b"m", b"d"}
    assert all(isinstance(v, bytes) for v in fields.values())
    entry = decode(fields)
    assert entry.records == 4
    assert entry.watermark == 12345
    assert entry.runs == ((0, 3), (7, 7))
    assert entry.table is not None
    assert entry.table.schema.equals(table.schema, check_metadata=True)
    assert entry.table.equals(table)
    assert entry.table.to_pylist() == table.to_pylist()


def test_header_is_a_msgpack_list_of_records_watermark_runs() -> None:
    table = pa.table({"k": ["a", "b", "c"]})
    fields = encode(table, -5, [(1, 2), (9, 11)])
    assert msgpack.unpackb(fields[b"m"]) == [3, -5, [[1, 2], [9, 11]]]
    assert decode_table(fields[b"d"]).equals(table)


def test_runs_accept_tuples_or_lists_and_decode_as_tuples() -> None:
    for given_runs in ([(0, 1)], [[0, 1]], ((0, 1),)):
        entry = decode(encode(None, 0, given_runs))  # type: ignore[arg-type]
        assert entry.runs == ((0, 1),)
        assert isinstance(entry.runs, tuple) and isinstance(entry.runs[0], tuple)
        hash(entry)  # a frozen Entry with tuple runs and no table is hashable


@pytest.mark.parametrize("watermark", [0, -1, 2**53, -(2**63), 2**64 - 1])
def test_heartbeat_entry_has_no_payload(watermark: int) -> None:
    fields = encode(None, watermark, [(0, 119)])
    assert set(fields) == {b"m"}
    entry = decode(fields)
    assert entry == Entry(records=0, watermark=watermark, runs=((0, 119),), table=None)


def test_heartbeat_with_no_runs() -> None:
    assert decode(encode(None, 7, [])) == Entry(0, 7, (), None)


def test_handover_marker_names_the_new_owner_and_carries_no_watermark() -> None:
    entry = decode(encode_marker(3))
    assert entry.marker == 3 and entry.records == 0 and entry.runs == () and entry.table is None
    assert decode(encode(None, 7, [])).marker is None


@pytest.mark.parametrize("target", [-1, "3", None])
def test_a_marker_without_an_instance_is_undecodable(target) -> None:
    with pytest.raises(DecodeError, match="handover marker"):
        decode({b"h": msgpack.packb(target)})


def test_empty_table_keeps_its_schema() -> None:
    table = pa.table({"k": pa.array([], pa.string()), "v": pa.array([], pa.int64())})
    fields = encode(table, 1, [(3, 3)])
    assert b"d" in fields  # an empty batch is not a heartbeat
    entry = decode(fields)
    assert entry.records == 0
    assert entry.table is not None
    assert entry.table.num_rows == 0
    assert entry.table.schema == table.schema


def test_multi_chunk_table_round_trips() -> None:
    table = pa.concat_tables([pa.table({"k": [1, 2]}), pa.table({"k": [3]}), pa.table({"k": [4, 5, 6]})])
    assert table.column("k").num_chunks == 3
    entry = decode(encode(table, 0, []))
    assert entry.records == 6
    assert entry.table is not None
    assert entry.table.column("k").to_pylist() == [1, 2, 3, 4, 5, 6]


def test_encode_table_and_decode_table_round_trip() -> None:
    table = mixed_table()
    assert decode_table(encode_table(table)).equals(table)
    assert decode_table(bytearray(encode_table(table))).equals(table)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({}, id="no-header"),
        pytest.param({b"d": encode_table(pa.table({"k": [1]}))}, id="payload-without-header"),
        pytest.param({b"m": b""}, id="empty-header"),
        pytest.param({b"m": b"\xc1"}, id="reserved-msgpack-byte"),
        pytest.param({b"m": msgpack.packb([1, 2])}, id="two-element-header"),
        pytest.param({b"m": msgpack.packb([1, 2, [], 4])}, id="four-element-header"),
        pytest.param({b"m": msgpack.packb({"records": 1})}, id="map-header"),
        pytest.param({b"m": msgpack.packb(["1", 2, []])}, id="string-records"),
        pytest.param({b"m": msgpack.packb([1, 2.5, []])}, id="float-watermark"),
        pytest.param({b"m": msgpack.packb([1, None, []])}, id="null-watermark"),
        pytest.param({b"m": msgpack.packb([0, 0, [[1]]])}, id="short-run"),
        pytest.param({b"m": msgpack.packb([0, 0, [[1, 2, 3]]])}, id="long-run"),
        pytest.param({b"m": msgpack.packb([0, 0, 5])}, id="runs-not-a-list"),
        pytest.param({b"m": msgpack.packb([0, 0, [[b"x", 1]]])}, id="bytes-in-run"),
        pytest.param({b"m": msgpack.packb([1, 0, []]), b"d": b"not arrow"}, id="garbage-payload"),
        pytest.param({b"m": msgpack.packb([1, 0, []]), b"d": b""}, id="empty-payload"),
        pytest.param(
            {b"m": msgpack.packb([1, 0, []]), b"d": encode_table(pa.table({"k": [1, 2]}))[:-20]},
            id="truncated-payload",
        ),
        pytest.param({b"m": None}, id="header-not-bytes"),
        pytest.param({b"m": "text"}, id="header-str"),
    ],
)
def test_malformed_entries_raise_decode_error(fields: dict) -> None:
    with pytest.raises(DecodeError):
        decode(fields)


def test_decode_error_is_a_value_error_and_chains_the_cause() -> None:
    with pytest.raises(ValueError) as info:
        decode({b"m": b"\xc1"})
    assert isinstance(info.value, DecodeError)
    assert info.value.__cause__ is not None


def test_decode_table_of_garbage_raises_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode_table(b"\x00" * 16)


# --- fuzz: anything malformed is a DecodeError, never another exception -------------------

VALID = encode(pa.table({"k": ["a", "b"], "v": [1, 2]}), 10, [(0, 1)])


def headers() -> st.SearchStrategy[bytes]:
    """Bytes that are often msgpack (so that decoding gets past the header) and sometimes not."""
    scalar = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=4) | st.binary(max_size=4)
    value = st.recursive(scalar, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=12)
    return st.binary(max_size=64) | value.map(msgpack.packb) | st.lists(value, min_size=3, max_size=3).map(msgpack.packb)


def payloads() -> st.SearchStrategy[bytes]:
    good = VALID[b"d"]
    return (
        st.binary(max_size=256)
        | st.integers(0, len(good)).map(lambda n: good[:n])
        | st.tuples(st.integers(0, len(good) - 1), st.integers(0, 255)).map(
            lambda p: good[: p[0]] + bytes([p[1]]) + good[p[0] + 1 :]
        )
    )


def check(fields: dict[bytes, bytes]) -> None:
    try:
        entry = decode(fields)
    except DecodeError:
        return
    assert isinstance(entry.records, int) and isinstance(entry.watermark, int)
    assert all(isinstance(lo, int) and isinstance(hi, int) for lo, hi in entry.runs)
    assert entry.table is None or isinstance(entry.table, pa.Table)
    assert (entry.table is None) == (b"d" not in fields)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers())
def test_fuzzed_header_only_raises_decode_error(m: bytes) -> None:
    check({b"m": m})
    check({b"m": m, b"d": VALID[b"d"]})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads())
def test_fuzzed_payload_only_raises_decode_error(d: bytes) -> None:
    check({b"m": VALID[b"m"], b"d": d})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers(), payloads())
def test_fuzzed_header_and_payload_only_raise_decode_error(m: bytes, d: bytes) -> None:
    check({b"m": m, b"d": d})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers())
def test_fuzzed_marker_is_an_instance_or_a_decode_error(h: bytes) -> None:
    try:
        entry = decode({b"h": h})
    except DecodeError:
        return
    assert isinstance(entry.marker, int) and entry.marker >= 0 and entry.table is None
