"""A declared record schema in Spark DDL ("user string, amount double, ts bigint") as an Arrow schema.

Our own parser for Spark's primitive types, not pyspark's `_parse_datatype_string`: that one needs a
running JVM, and the spec is validated (and external input decoded) where there is none. Spark's
spellings and aliases are accepted (`bigint` or `long`, `int` or `integer`, `name: type`, backquoted
names); nested and temporal types are refused with the column named.
"""

from __future__ import annotations

import re

import pyarrow as pa

_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(), "byte": pa.int8(),
    "smallint": pa.int16(), "short": pa.int16(),
    "int": pa.int32(), "integer": pa.int32(),
    "bigint": pa.int64(), "long": pa.int64(),
    "float": pa.float32(), "real": pa.float32(),
    "double": pa.float64(),
}
_SIZED_STRING = re.compile(r"^(var)?char\(\s*\d+\s*\)$")
_COLUMN = re.compile(r"^\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)\s*:?\s*(.*?)\s*$", re.S)
_NOT_NULL = re.compile(r"\s+not\s+null$")

SUPPORTED = "string, boolean, tinyint, smallint, int, bigint, float, double"

_NAMES = {t: name for name, t in reversed(_TYPES.items())}  # the first spelling of each type


def type_name(arrow_type: pa.DataType) -> str:
    """The DDL spelling of a declared column's type, for messages."""
    return _NAMES.get(arrow_type, str(arrow_type))


def parse(ddl: str) -> pa.Schema:
    """The Arrow schema of a DDL column list; ValueError names the column at fault."""
    fields: list[pa.Field] = []
    for i, part in enumerate(_split(ddl)):
        match = _COLUMN.match(part)
        if not match or not match.group(2):
            raise ValueError(f"column {i + 1} ({part.strip()!r}): expected 'name type'")
        raw_name, spelled = match.groups()
        name = raw_name[1:-1].replace("``", "`") if raw_name.startswith("`") else raw_name
        spelled = _NOT_NULL.sub("", spelled.lower())  # every column is nullable: a missing field is a null
        arrow_type = pa.string() if _SIZED_STRING.match(spelled) else _TYPES.get(spelled)
        if arrow_type is None:
            raise ValueError(f"column {name!r}: type {spelled!r} is not supported (use one of {SUPPORTED})")
        if name in (f.name for f in fields):
            raise ValueError(f"column {name!r} is declared twice")
        fields.append(pa.field(name, arrow_type))
    if not fields:
        raise ValueError("declares no column")
    return pa.schema(fields)


def _split(ddl: str) -> list[str]:
    """Columns separated by commas outside parentheses, angle brackets and backquotes."""
    parts, depth, quoted, current = [], 0, False, []
    for ch in ddl:
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "(<":
            depth += 1
        elif not quoted and ch in ")>":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()] if ddl.strip() else []
