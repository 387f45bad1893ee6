"""Decoding a redis_stream source's entries: each format, typed columns from a declared schema, and bad
values dead-lettered with their field named while the rest of the batch goes on."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pydantic import ValidationError
from streamjobs_core import ddl
from streamjobs_core.codec import encode_table
from streamjobs_core.loading import SpecError, parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.shedding import shed_mask
from streamjobs_core.spec import LoadShedding
from streamjobs_worker.external import Decoder, entry_times, record_id

SCHEMA = "user string, amount double, n int"


def source(**fields):
    job = parse_job({"metadata": {"name": "ext"}, "spec": {
        "sources": [{"name": "in", "type": "redis_stream", **fields}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["in"]}]}})
    return job.spec.sources[0]


def ids(n: int, first_ms: int = 1_700_000_000_000) -> list[bytes]:
    return [b"%d-%d" % (first_ms + i // 2, i % 2) for i in range(n)]


def flat(record: dict) -> list[bytes]:
    """An entry's fields as a raw XREAD reply holds them."""
    return [x.encode() if isinstance(x, str) else x for kv in record.items() for x in kv]


def errors(decoded) -> dict[int, str]:
    return {bad.entry: bad.error for bad in decoded.bad}


# --- the declared schema -----------------------------------------------------------


def test_ddl_gives_typed_arrow_columns_in_spark_spellings():
    schema = ddl.parse("a string, `b c` BIGINT, d: long, e int not null, f double, g float, h boolean, "
                       "i smallint, j tinyint, k varchar(10)")
    assert [(f.name, f.type) for f in schema] == [
        ("a", pa.string()), ("b c", pa.int64()), ("d", pa.int64()), ("e", pa.int32()), ("f", pa.float64()),
        ("g", pa.float32()), ("h", pa.bool_()), ("i", pa.int16()), ("j", pa.int8()), ("k", pa.string())]


@pytest.mark.parametrize("text, named", [
    ("a string, b timestamp", "column 'b': type 'timestamp' is not supported"),
    ("a string, b decimal(10, 2)", "column 'b': type 'decimal(10, 2)'"),
    ("a string, a int", "column 'a' is declared twice"),
    ("a string, b", "column 2 ('b'): expected 'name type'"),
    ("", "declares no column"),
])
def test_a_bad_schema_is_refused_naming_the_column(text, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        ddl.parse(text)


@pytest.mark.parametrize("fields, message", [
    ({"format": "json"}, "format 'json' needs a schema"),
    ({"schema": "a string, b bigint", "eventTimeField": "a"}, "eventTimeField 'a' must be an integer column"),
    ({"schema": "a string", "eventTimeField": "t"}, "eventTimeField 't' must be an integer column"),
    ({"payloadField": "doc"}, "payloadField applies to formats json and arrow only"),
    ({"schema": "a string, event_time bigint"}, "column 'event_time' is reserved"),
    ({"schema": "a double", "loadShedding": {"maxBacklogRecords": 10, "priorityField": "p"}},
     "loadShedding.priorityField: the schema has no column 'p'"),
    ({"retention": {"mode": "trim", "ms": 10}}, "ms applies to mode 'time' only"),
    ({"schema": "a uuid"}, "spec.sources[0].schema"),
])
def test_a_bad_source_spec_is_refused_naming_the_field(fields, message):
    with pytest.raises((SpecError, ValidationError)) as error:
        source(**fields)
    assert message in str(error.value)


def test_input_is_kept_ten_minutes_after_its_commit_unless_set():
    assert (source().retention.mode, source().retention.keep_ms) == ("time", 600_000)
    assert source(retention={"mode": "trim"}).retention.keep_ms == 0
    assert source(retention={"ms": 5_000}).retention.keep_ms == 5_000


@pytest.mark.parametrize("fields", [
    {}, {"format": "json", "schema": SCHEMA, "payloadField": "doc", "retention": {"mode": "trim"}},
    {"format": "arrow", "schema": SCHEMA, "eventTimeField": "n", "retention": {"ms": 0}},
])
def test_a_source_spec_survives_the_plans_round_trip(fields):
    """Workers read the spec back from the plan, with every default written out."""
    job = parse_job({"metadata": {"name": "ext"}, "spec": {
        "sources": [{"name": "in", "type": "redis_stream", **fields}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["in"]}]}})
    assert JobPlan.from_json(JobPlan(job, 0).to_json()).job == job


# --- format fields -----------------------------------------------------------------


def test_fields_become_typed_columns_and_a_value_that_does_not_parse_is_dead_lettered_by_field():
    decoder = Decoder(source(schema=SCHEMA))
    entries = [{"user": "a", "amount": "1.5", "n": "3"}, {"user": "b", "amount": "lots", "n": "4"},
               {"n": "5", "user": "c", "extra": "ignored"}, {"user": "d", "amount": "2", "n": "99999999999"},
               {"user": b"\xff\xfe", "amount": "1", "n": "1"}]
    decoded = decoder.decode(ids(5), [flat(e) for e in entries])
    assert decoded.table.schema.types[:3] == [pa.string(), pa.float64(), pa.int32()]
    assert decoded.table.select(["user", "amount", "n"]).to_pylist() == [
        {"user": "a", "amount": 1.5, "n": 3}, {"user": "c", "amount": None, "n": 5}]  # a missing field is null
    assert decoded.entry.tolist() == [0, 2]
    assert errors(decoded) == {1: "field 'amount': 'lots' is not a double",
                               3: "field 'n': '99999999999' is not a int",
                               4: "field 'user': '\ufffd\ufffd' is not UTF-8 text"}
    assert decoded.bad[0].record == {"user": b"b", "amount": b"lots", "n": b"4"}  # the record, as read
    assert decoded.records == 5


def test_without_a_schema_every_field_is_a_string_column_as_before():
    decoded = Decoder(source()).decode(ids(2), [flat({"k": "a", "n": "1"}), flat({"k": b"\xff", "z": "2"})])
    assert decoded.table.schema.names == ["k", "n", "z", "event_time", "_ingest_ms"]
    assert decoded.table.select(["k", "n", "z"]).to_pylist() == [
        {"k": "a", "n": "1", "z": None}, {"k": "\ufffd", "n": None, "z": "2"}]
    assert not decoded.bad


def test_redis_pys_parsed_reply_decodes_as_the_raw_one():
    entries = [{"user": "a", "amount": "1.5", "n": "3"}, {"user": "b", "amount": "x", "n": "4"}]
    decoder = Decoder(source(schema=SCHEMA))
    raw = decoder.decode(ids(2), [flat(e) for e in entries])
    parsed = decoder.decode(ids(2), [{k.encode(): v.encode() for k, v in e.items()} for e in entries])
    assert raw.table.equals(parsed.table) and errors(raw) == errors(parsed)


def test_a_thousand_bad_values_among_many_are_found_exactly():
    values = [str(i * 0.5) if i % 97 else f"x{i}" for i in range(20_000)]
    decoded = Decoder(source(schema="amount double")).decode(ids(len(values)), [[b"amount", v.encode()] for v in values])
    assert sorted(errors(decoded)) == [i for i in range(20_000) if i % 97 == 0]
    assert decoded.table.column("amount").to_pylist() == [i * 0.5 for i in range(20_000) if i % 97]


# --- event time and ingest time ----------------------------------------------------


def test_event_time_and_ingest_time_default_to_the_entry_ids_time():
    decoded = Decoder(source(schema=SCHEMA)).decode([b"1700000000123-0", b"1700000000123-1", b"1700000000999-0"],
                                                    [flat({"user": "a"})] * 3)
    assert decoded.table.column("event_time").to_pylist() == [1700000000123, 1700000000123, 1700000000999]
    assert decoded.table.column("_ingest_ms").to_pylist() == [1700000000123, 1700000000123, 1700000000999]
    assert entry_times([b"5-3"])[0].tolist() == [5]


def test_an_event_time_field_that_does_not_parse_is_dead_lettered_by_name():
    decoded = Decoder(source(eventTimeField="t")).decode(ids(3), [flat({"t": "1000"}), flat({"t": "soon"}),
                                                                  flat({"k": "no time"})])
    assert decoded.table.column("event_time").to_pylist() == [1000]
    assert decoded.table.column("_ingest_ms").to_pylist() == [1_700_000_000_000]  # the entry ID's time
    assert errors(decoded) == {1: "bad event time field: field 't': 'soon' is not a bigint",
                               2: "bad event time field: field 't' is missing"}


# --- format json -------------------------------------------------------------------


def json_entries(docs) -> list[list[bytes]]:
    return [[b"data", d if isinstance(d, bytes) else json.dumps(d).encode()] for d in docs]


def test_json_documents_become_typed_rows_and_bad_ones_are_dead_lettered_by_field():
    docs = [{"user": "a", "amount": 1, "n": 2, "other": [1]}, {"user": "b", "amount": "12.5", "n": 1},
            b'{"user":\n  "c", "amount": 2.5}', b'{"user": ', b"[1, 2]", {"user": "f", "n": 1.5},
            {"user": "g", "n": 2 ** 40}, b"", {"user": 7}]
    decoded = Decoder(source(format="json", schema=SCHEMA)).decode(ids(len(docs)), json_entries(docs))
    assert decoded.table.select(["user", "amount", "n"]).to_pylist() == [
        {"user": "a", "amount": 1.0, "n": 2}, {"user": "c", "amount": 2.5, "n": None}]
    assert decoded.entry.tolist() == [0, 2]
    found = errors(decoded)
    assert found[1] == "field 'amount': '12.5' is not a double"
    assert found[3].startswith("not a JSON document")
    assert found[4] == "not a JSON object but list"
    assert found[5] == "field 'n': 1.5 is not a int"
    assert found[6] == f"field 'n': {2 ** 40} is not a int"
    assert found[7].startswith("not a JSON document")
    assert found[8] == "field 'user': 7 is not a string"
    assert decoded.bad[0].record == {"data": json.dumps(docs[1]).encode()}


def test_a_json_entry_without_its_payload_field_is_dead_lettered_and_the_field_is_configurable():
    decoder = Decoder(source(format="json", schema=SCHEMA, payloadField="doc"))
    decoded = decoder.decode(ids(2), [[b"doc", b'{"user": "a"}'], [b"data", b'{"user": "b"}']])
    assert decoded.table.column("user").to_pylist() == ["a"]
    assert errors(decoded) == {1: "no field 'doc' (format json)"}


# --- format arrow ------------------------------------------------------------------


def test_arrow_payloads_give_every_record_of_every_entry_and_bad_records_are_dead_lettered_by_field():
    first = pa.table({"user": ["a", "b"], "amount": [1.0, 2.0], "n": pa.array([1, 2], pa.int64())})
    second = pa.table({"user": ["c", "d", "e"], "amount": ["3.5", "zz", None]})  # other types, n missing
    entries = [[b"data", encode_table(first)], [b"data", b"not arrow"], [b"data", encode_table(second)],
               [b"other", b"x"]]
    decoded = Decoder(source(format="arrow", schema=SCHEMA)).decode(ids(4), entries)
    assert decoded.table.schema.types[:3] == [pa.string(), pa.float64(), pa.int32()]
    assert decoded.table.select(["user", "amount", "n"]).to_pylist() == [
        {"user": "a", "amount": 1.0, "n": 1}, {"user": "b", "amount": 2.0, "n": 2},
        {"user": "c", "amount": 3.5, "n": None}, {"user": "e", "amount": None, "n": None}]
    assert decoded.entry.tolist() == [0, 0, 2, 2] and decoded.row.tolist() == [0, 1, 0, 2]
    assert decoded.table.column("_ingest_ms").to_pylist() == [1_700_000_000_000] * 2 + [1_700_000_000_001] * 2
    found = errors(decoded)
    assert found[1] == "field 'data': no Arrow IPC message at byte 0"
    assert found[2] == "record 1 of the entry: field 'amount': 'zz' is not a double"
    assert found[3] == "no field 'data' (format arrow)"
    assert decoded.bad[1].record == {"user": "d", "amount": "zz"}
    assert decoded.records == 4 + 3
    assert record_id(b"5-0", 2) == b"5-0/2" and record_id(b"5-0", None) == b"5-0"


# --- the same verdicts whatever the batch -----------------------------------------------


@pytest.mark.parametrize("fmt", ["fields", "json", "arrow"])
def test_decoding_does_not_depend_on_how_entries_are_batched(fmt):
    """The oracle decodes a run's whole input at once; the source decoded it batch by batch."""
    rows = [{"user": f"u{i}", "amount": ("bad" if i % 7 == 0 else i / 4), "n": (2 ** 35 if i % 11 == 0 else i)}
            for i in range(300)]
    if fmt == "fields":
        entries = [flat({k: str(v) for k, v in row.items()}) for row in rows]
    elif fmt == "json":
        entries = json_entries(rows)
    else:
        entries = [[b"data", encode_table(pa.table({k: [str(row[k]) for row in rows[i:i + 10]] for k in rows[0]}))]
                   for i in range(0, 300, 10)]
    decoder = Decoder(source(format=fmt, schema=SCHEMA))
    whole = decoder.decode(ids(len(entries)), entries)
    parts = [decoder.decode(ids(len(entries))[i:i + 7], entries[i:i + 7]) for i in range(0, len(entries), 7)]
    assert pa.concat_tables([p.table for p in parts if p.table is not None]).equals(whole.table)
    assert sorted(b.error for b in whole.bad) == sorted(b.error for p in parts for b in p.bad)
    assert whole.table.num_rows == len([i for i in range(300) if i % 7 and i % 11])


# --- load shedding on typed columns ------------------------------------------------------


def test_shedding_reads_a_typed_priority_column_lowest_first():
    decoded = Decoder(source(schema="p double")).decode(ids(6), [flat({"p": v}) for v in ("9", "10", "2.5", "100", "1", "50")])
    mask = shed_mask(decoded.table, LoadShedding(max_backlog_records=1, fraction=0.5, priority_field="p"), [])
    assert mask.tolist() == [True, False, True, False, True, False]
