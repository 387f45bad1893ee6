"""JSON documents, one per entry, parsed against a declared schema many at once.

pyarrow.json reads the whole batch in one call. When the batch does not parse as a whole, Python's C
JSON parser and a vectorized check of the values' kinds pick the suspects, each then read alone by
Arrow, whose verdict on a document is the same whatever batch it came in (the oracle relies on that).
"""

from __future__ import annotations

import io
import json
from operator import methodcaller

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from .casts import describe


def read_documents(docs: list[bytes], schema: pa.Schema) -> tuple[pa.Table | None, dict[int, str]]:
    """The documents parsed against the schema, one row each, and the error of each one that does not parse
    (by its index in `docs`; the table holds the others, in order)."""
    try:
        return (_parse_json(docs, schema) if docs else None), {}
    except (pa.ArrowInvalid, ValueError):
        pass
    failed: dict[int, str] = {}
    for i in _suspects(docs, schema).tolist():
        try:
            _parse_json([docs[i]], schema)
        except (pa.ArrowInvalid, ValueError) as exc:
            failed[i] = _json_error(docs[i], schema, exc)
    keep = np.ones(len(docs), dtype=bool)
    keep[list(failed)] = False
    good = np.flatnonzero(keep)
    table, missed = _bisect_documents([docs[i] for i in good.tolist()], schema)  # one read, unless a suspect hid
    failed.update({int(good[j]): error for j, error in missed.items()})
    return table, failed


def _suspects(docs: list[bytes], schema: pa.Schema) -> np.ndarray:
    """Documents that are likely not to parse: not JSON objects, or a declared field of the wrong kind."""
    n = len(docs)
    try:
        parsed = json.loads(b"[" + b",".join(docs) + b"]", parse_constant=_refuse)
    except (ValueError, RecursionError):  # a malformed or deep document: each on its own (dead letters follow)
        parsed = list(map(_load, docs))
    values = np.fromiter(parsed, dtype=object, count=n)
    kinds = np.frompyfunc(type, 1, 1)(values)
    suspect = kinds != dict
    values[suspect] = _NOT_AN_OBJECT
    for field in schema:
        column = np.fromiter(map(methodcaller("get", field.name), values), dtype=object, count=n)
        kinds = np.frompyfunc(type, 1, 1)(column)
        fits = kinds == type(None)
        for kind in _KINDS[_kind(field.type)]:
            fits |= kinds == kind
        if pa.types.is_integer(field.type):
            bits = field.type.bit_width - 1
            ints = np.where(kinds == int, column, 0)
            fits &= (ints >= -(1 << bits)) & (ints < (1 << bits))
        suspect |= ~fits
    return np.flatnonzero(suspect)


_NOT_AN_OBJECT: dict = {}
_KINDS = {"string": (str,), "bool": (bool,), "int": (int,), "float": (int, float)}


def _kind(arrow_type: pa.DataType) -> str:
    return ("int" if pa.types.is_integer(arrow_type) else "float" if pa.types.is_floating(arrow_type)
            else "bool" if pa.types.is_boolean(arrow_type) else "string")


def _refuse(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _load(doc: bytes):
    try:
        return json.loads(doc, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None


def _bisect_documents(docs: list[bytes], schema: pa.Schema) -> tuple[pa.Table | None, dict[int, str]]:
    """As _read_documents, by halving the parts that fail: cheap when few fail."""
    failed: dict[int, str] = {}
    parts: list[tuple[int, int]] = [(0, len(docs))] if docs else []
    tables: list[tuple[int, pa.Table]] = []
    while parts:
        lo, hi = parts.pop()
        try:
            tables.append((lo, _parse_json(docs[lo:hi], schema)))
        except (pa.ArrowInvalid, ValueError) as exc:
            if hi - lo == 1:
                failed[lo] = _json_error(docs[lo], schema, exc)
            else:
                mid = (lo + hi) // 2
                parts.extend(((mid, hi), (lo, mid)))
    if not tables:
        return None, failed
    tables.sort(key=lambda t: t[0])
    return pa.concat_tables([t for _, t in tables]), failed


def _parse_json(docs: list[bytes], schema: pa.Schema) -> pa.Table:
    joined = b"\n".join(docs)
    if joined.count(b"\n") != len(docs) - 1 or b"\r" in joined:
        # The reader takes one document per line. A raw line break inside a JSON document can only be
        # whitespace between tokens (strings escape theirs), and a control character like \x1e cannot be
        # anywhere in one (a document that holds it anyway splits in two, gives a row too many and fails).
        joined = b"\x1e".join(docs).replace(b"\n", b" ").replace(b"\r", b" ").replace(b"\x1e", b"\n")
    block = max(2 * max(map(len, docs)) + 2, min(1 << 20, len(joined) + 1))  # a document never straddles two
    table = pa_json.read_json(
        io.BytesIO(joined),
        # One thread: the worker shares its cores with Spark, and small reads start no pool.
        read_options=pa_json.ReadOptions(use_threads=False, block_size=block),
        parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    if table.num_rows != len(docs):  # an empty document is no row at all
        raise ValueError(f"{len(docs)} documents gave {table.num_rows} rows")
    return table.select(schema.names).cast(schema)


def _json_error(doc: bytes, schema: pa.Schema, exc: Exception) -> str:
    """Why one document does not parse, naming the field where one is at fault."""
    try:
        value = json.loads(doc)
    except ValueError as error:
        return f"not a JSON document: {error}"
    except RecursionError:
        return "nested too deeply to be checked (Python's parser gives up): not a document of the schema"
    if not isinstance(value, dict):
        return f"not a JSON object but {type(value).__name__}"
    for field in schema:
        item = value.get(field.name)
        if item is not None and not _fits(item, field.type):
            return f"field {field.name!r}: {describe(item, field.type)}"
    return f"does not parse against the schema: {exc}"


def _fits(value, to: pa.DataType) -> bool:
    if pa.types.is_string(to):
        return isinstance(value, str)
    if pa.types.is_boolean(to):
        return isinstance(value, bool)
    if pa.types.is_integer(to):
        bits = to.bit_width - 1
        return type(value) is int and -(1 << bits) <= value < (1 << bits)
    if pa.types.is_floating(to):
        return type(value) in (int, float)
    return True
