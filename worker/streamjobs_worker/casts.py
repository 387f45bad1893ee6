"""Casting a column to a declared type when some of its values do not cast: each failing row found and
its error, naming the field, kept, the rest cast.

Arrow's cast fails for a whole array. The failing rows are then found without a step per record: a
vectorized guess (a pattern of the type's syntax) splits the values, the likely ones are cast at once
and halved where that fails, the unlikely ones are tried one by one (they are dead-lettered one by one
anyway). The verdict on every value is Arrow's own, whatever else its batch holds.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core import ddl

_SHOWN_CHARS = 60  # of a bad value, in its error

# A first, vectorized guess at which strings parse as a type; Arrow's cast has the last word.
_LIKELY = {
    "int": r"^-?[0-9]+$",
    "float": r"^[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[nN][aA][nN]|[iI][nN][fF]([iI][nN][iI][tT][yY])?)$",
    "bool": r"^([tT][rR][uU][eE]|[fF][aA][lL][sS][eE]|1|0)$",
}


def cast(values: pa.Array, to: pa.DataType, name: str, bad: dict[int, str]) -> pa.Array:
    """`values` cast to `to`, null where a value does not cast; each such row's error, naming the field,
    added to `bad` (row -> error) unless the row has one already."""
    if values.type == to:
        return values
    try:
        return pc.cast(values, to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    present = ~values.is_null().to_numpy(zero_copy_only=False)
    try:
        pc.cast(values.slice(0, 0), to)
    except pa.ArrowNotImplementedError:  # no value of this type casts: every present row fails
        _failed(values, np.flatnonzero(present), to, name, bad)
        return pa.nulls(len(values), to)
    likely = _likely(values, to) & present
    failing = np.sort(np.concatenate([_bisect(values, np.flatnonzero(likely), to),
                                      _each(values, np.flatnonzero(present & ~likely), to)]))
    _failed(values, failing, to, name, bad)
    mask = np.zeros(len(values), dtype=bool)
    mask[failing] = True
    return pc.cast(pc.if_else(pa.array(mask), pa.scalar(None, values.type), values), to)


def _failed(values: pa.Array, rows: np.ndarray, to: pa.DataType, name: str, bad: dict[int, str]) -> None:
    for i in rows.tolist():
        bad.setdefault(i, f"field {name!r}: {describe(values[i].as_py(), to)}")


def describe(value, to: pa.DataType) -> str:
    """Why a value is not of a declared type, for a dead letter."""
    if isinstance(value, bytes):
        if pa.types.is_string(to):
            return f"{_shown(value.decode('utf-8', 'replace'))!r} is not UTF-8 text"
        value = value.decode("utf-8", "replace")
    return f"{_shown(value)!r} is not a {ddl.type_name(to)}"


def _shown(value):
    return value[:_SHOWN_CHARS] + "..." if isinstance(value, str) and len(value) > _SHOWN_CHARS else value


def _likely(values: pa.Array, to: pa.DataType) -> np.ndarray:
    """A vectorized guess of the values that cast: a pattern of the target type's syntax for strings."""
    kind = ("int" if pa.types.is_integer(to) else "float" if pa.types.is_floating(to)
            else "bool" if pa.types.is_boolean(to) else None)
    if kind is None or not pa.types.is_string(values.type):
        return np.ones(len(values), dtype=bool)
    return pc.fill_null(pc.match_substring_regex(values, _LIKELY[kind]), False).to_numpy(zero_copy_only=False)


def _bisect(values: pa.Array, rows: np.ndarray, to: pa.DataType) -> np.ndarray:
    """The rows among `rows` whose value does not cast, found by halving the parts that fail."""
    failing, parts = [], [rows] if len(rows) else []
    while parts:
        part = parts.pop()
        try:
            pc.cast(values.take(pa.array(part)), to)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            if len(part) == 1:
                failing.append(part[0])
            else:
                parts.extend((part[: len(part) // 2], part[len(part) // 2 :]))
    return np.array(failing, dtype=np.int64)


def _each(values: pa.Array, rows: np.ndarray, to: pa.DataType) -> np.ndarray:
    """The rows among `rows` whose value does not cast: rows the guess expects to fail, tried one by one."""
    failing = []
    for i in rows.tolist():
        try:
            pc.cast(values.slice(i, 1), to)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            failing.append(i)
    return np.array(failing, dtype=np.int64)
