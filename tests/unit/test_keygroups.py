"""Key groups: Flink's range assignment, stable key hashing, run compression."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streamjobs_core.keygroups import Assignment, key_groups_of, range_of_instance, runs

pytestmark = pytest.mark.unit

PAIRS = [
    (max_parallelism, parallelism)
    for max_parallelism in (1, 2, 3, 7, 10, 16, 100, 120, 128, 1000, 4096, 32768)
    for parallelism in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 64, 100, 120, 128, 1000)
    if parallelism <= max_parallelism
]


def flink_range(instance: int, parallelism: int, max_parallelism: int) -> range:
    """KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex, transcribed from Flink."""
    start = ((instance * max_parallelism) + parallelism - 1) // parallelism
    end = ((instance + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def flink_operator_index(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """KeyGroupRangeAssignment.computeOperatorIndexForKeyGroup."""
    return key_group * parallelism // max_parallelism


# --- ranges -----------------------------------------------------------------------


@pytest.mark.parametrize(("max_parallelism", "parallelism"), PAIRS)
def test_range_of_instance_matches_flink(max_parallelism: int, parallelism: int) -> None:
    ranges = [range_of_instance(i, parallelism, max_parallelism) for i in range(parallelism)]
    assert ranges == [flink_range(i, parallelism, max_parallelism) for i in range(parallelism)]
    # Contiguous, disjoint, in order and covering 0 .. maxParallelism-1.
    assert ranges[0].start == 0
    assert ranges[-1].stop == max_parallelism
    for before, after in zip(ranges, ranges[1:]):
        assert before.stop == after.start
    assert [kg for r in ranges for kg in r] == list(range(max_parallelism))
    # Balanced: sizes differ by at most one, and no instance is left without key groups.
    sizes = [len(r) for r in ranges]
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1
    # The inverse Flink formula names the same owner for every key group.
    for i, r in enumerate(ranges):
        for kg in (r.start, r.stop - 1):
            assert flink_operator_index(kg, parallelism, max_parallelism) == i


@pytest.mark.parametrize(
    ("max_parallelism", "parallelism", "expected"),
    [
        (10, 3, [range(0, 4), range(4, 7), range(7, 10)]),
        (128, 3, [range(0, 43), range(43, 86), range(86, 128)]),
        (120, 7, [range(0, 18), range(18, 35), range(35, 52), range(52, 69), range(69, 86), range(86, 103), range(103, 120)]),
        (120, 4, [range(0, 30), range(30, 60), range(60, 90), range(90, 120)]),
        (5, 5, [range(i, i + 1) for i in range(5)]),
    ],
)
def test_known_ranges(max_parallelism: int, parallelism: int, expected: list[range]) -> None:
    assert [range_of_instance(i, parallelism, max_parallelism) for i in range(parallelism)] == expected


@pytest.mark.parametrize(("max_parallelism", "parallelism"), PAIRS)
def test_assignment_ranges_agrees(max_parallelism: int, parallelism: int) -> None:
    assignment = Assignment.ranges(parallelism, max_parallelism, epoch=7)
    assert assignment.epoch == 7
    assert len(assignment.owners) == max_parallelism
    assert assignment.parallelism == parallelism
    assert list(assignment.owners) == [
        flink_operator_index(kg, parallelism, max_parallelism) for kg in range(max_parallelism)
    ]
    for instance in sorted({0, parallelism // 2, parallelism - 1}):
        assert assignment.owned_by(instance) == tuple(range_of_instance(instance, parallelism, max_parallelism))
    assert assignment.owned_by(parallelism) == ()


def test_assignment_defaults_and_value_semantics() -> None:
    a = Assignment.ranges(2, 4)
    assert a == Assignment(1, (0, 0, 1, 1))
    assert hash(a) == hash(Assignment(1, (0, 0, 1, 1)))
    assert a != Assignment.ranges(2, 4, epoch=2)
    with pytest.raises(AttributeError):
        a.epoch = 3  # type: ignore[misc]


def test_assignment_parallelism_of_uneven_owners() -> None:
    assert Assignment(1, (0, 2, 2, 1)).parallelism == 3
    assert Assignment(1, (0, 2, 2, 1)).owned_by(2) == (1, 2)


# --- key hashing ----------------------------------------------------------------------

WORDS = [f"w{i}" for i in range(50)] + ["", "ä", "日本", "a b", "x" * 300]
INTS = [0, 1, -1, 2, 3, 41, 2**31, -(2**31), 2**62, -(2**62)]


def test_key_groups_are_in_range() -> None:
    for max_parallelism in (1, 2, 7, 120, 128, 32768):
        groups = key_groups_of(np.array(WORDS, dtype=object), max_parallelism)
        assert groups.dtype == np.int64
        assert groups.shape == (len(WORDS),)
        assert groups.min() >= 0 and groups.max() < max_parallelism
        groups = key_groups_of(np.array(INTS, dtype=np.int64), max_parallelism)
        assert groups.min() >= 0 and groups.max() < max_parallelism
    assert set(key_groups_of(np.array(WORDS, dtype=object), 1).tolist()) == {0}


def test_key_groups_are_deterministic_and_elementwise() -> None:
    keys = np.array(WORDS, dtype=object)
    whole = key_groups_of(keys, 120)
    assert np.array_equal(whole, key_groups_of(keys.copy(), 120))
    # A key's group does not depend on the other keys in the batch, nor on their order.
    singles = [int(key_groups_of(np.array([k], dtype=object), 120)[0]) for k in WORDS]
    assert whole.tolist() == singles
    reversed_keys = keys[::-1]
    assert key_groups_of(reversed_keys, 120).tolist() == whole.tolist()[::-1]
    # Equal keys go together.
    repeated = key_groups_of(np.array(["a", "b", "a", "a"], dtype=object), 120)
    assert repeated[0] == repeated[2] == repeated[3]


def test_routing_is_a_durable_format() -> None:
    """State and streams are partitioned by these values: a changed hash would misroute after an upgrade."""
    assert key_groups_of(pa.array(["a", "b"]), 120).tolist() == [24, 55]
    assert key_groups_of(pa.array([1, 2, 3]), 120).tolist() == [109, 10, 56]


def test_key_groups_are_the_same_in_another_process() -> None:
    sizes = (120, 128, 4096)

    def compute() -> dict[str, list[list[int]]]:
        return {
            "words": [key_groups_of(np.array(WORDS, dtype=object), m).tolist() for m in sizes],
            "ints": [key_groups_of(np.array(INTS, dtype=np.int64), m).tolist() for m in sizes],
            "arrow": [key_groups_of(pa.array(WORDS), m).tolist() for m in sizes],
        }

    script = (
        "import json, sys, numpy as np, pyarrow as pa\n"
        "from streamjobs_core.keygroups import key_groups_of\n"
        "words, ints, sizes = json.loads(sys.stdin.read())\n"
        "print(json.dumps({\n"
        "    'words': [key_groups_of(np.array(words, dtype=object), m).tolist() for m in sizes],\n"
        "    'ints': [key_groups_of(np.array(ints, dtype=np.int64), m).tolist() for m in sizes],\n"
        "    'arrow': [key_groups_of(pa.array(words), m).tolist() for m in sizes],\n"
        "    'salted': hash('w1'),\n"
        "}))\n"
    )
    seed = "12345" if os.environ.get("PYTHONHASHSEED") != "12345" else "54321"
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps([WORDS, INTS, sizes]),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": seed},
        timeout=120,
        check=True,
    )
    there = json.loads(done.stdout)
    # The other process salts Python's hash() differently ...
    assert there.pop("salted") != hash("w1")
    # ... yet agrees with this one on every key group.
    assert there == compute()


def test_string_keys_agree_across_array_kinds() -> None:
    expected = key_groups_of(np.array(WORDS, dtype=object), 120).tolist()
    assert key_groups_of(pa.array(WORDS), 120).tolist() == expected
    assert key_groups_of(pa.array(WORDS, pa.large_string()), 120).tolist() == expected
    assert key_groups_of(pa.array(WORDS).dictionary_encode(), 120).tolist() == expected
    assert key_groups_of(pa.chunked_array([WORDS[:10], WORDS[10:]]), 120).tolist() == expected
    assert key_groups_of(pa.chunked_array([WORDS[:10], WORDS[10:]]).combine_chunks(), 120).tolist() == expected
    # Fixed-width numpy strings (what np.array(list_of_str) gives) used to crash in pandas.
    assert key_groups_of(np.array(WORDS), 120).tolist() == expected


def test_int_keys_agree_across_array_kinds() -> None:
    small = [k for k in INTS if -(2**31) <= k < 2**31]
    expected = key_groups_of(np.array(small, dtype=np.int64), 120).tolist()
    assert key_groups_of(pa.array(small, pa.int64()), 120).tolist() == expected
    assert key_groups_of(pa.array(small, pa.int32()), 120).tolist() == expected
    assert key_groups_of(np.array(small, dtype=np.int32), 120).tolist() == expected
    # Regression: pandas hashes the bits, so a narrow negative key (int32 -1) used to land elsewhere
    # than the same key as int64 (e.g. when a user function returns the key column as bigint).
    assert key_groups_of(np.array([-1, -7, -128], np.int8), 120).tolist() == key_groups_of(
        np.array([-1, -7, -128], np.int64), 120
    ).tolist()
    assert key_groups_of(pa.array([7, 200], pa.uint8()), 120).tolist() == key_groups_of(
        pa.array([7, 200], pa.int64()), 120
    ).tolist()
    assert key_groups_of(pa.chunked_array([small[:3], small[3:]], pa.int64()), 120).tolist() == expected
    # Ints and their decimal strings are different keys.
    assert key_groups_of(np.array([str(k) for k in range(100)], dtype=object), 120).tolist() != key_groups_of(
        np.arange(100), 120
    ).tolist()


@pytest.mark.parametrize("arrow_type", [pa.int64(), pa.int32(), pa.int8(), pa.uint16()])
def test_a_null_key_does_not_move_the_other_keys(arrow_type: pa.DataType) -> None:
    # Regression: pyarrow turns an int column with nulls into float64, which hashes differently,
    # so a key's group depended on whether its batch (e.g. sparse NEXMark columns) held a null.
    values = [1, 2, 3, 100]
    without = key_groups_of(pa.array(values, arrow_type), 120).tolist()
    with_nulls = key_groups_of(pa.array([1, None, 2, 3, None, 100], arrow_type), 120).tolist()
    assert [with_nulls[i] for i in (0, 2, 3, 5)] == without
    chunked = key_groups_of(pa.chunked_array([[1, 2], [None], [3, 100]], arrow_type), 120).tolist()
    assert [chunked[i] for i in (0, 1, 3, 4)] == without
    # All nulls go to one key group: the one of a null string key.
    null_group = key_groups_of(pa.array([None], pa.string()), 120).tolist()[0]
    assert with_nulls[1] == with_nulls[4] == chunked[2] == null_group
    assert key_groups_of(pa.array([None, None], arrow_type), 120).tolist() == [null_group] * 2


def test_a_null_key_does_not_move_boolean_or_string_keys() -> None:
    assert key_groups_of(pa.array([True, None, False]), 120).tolist()[::2] == key_groups_of(
        pa.array([True, False]), 120
    ).tolist()
    assert key_groups_of(pa.array(["a", None, "b"]), 120).tolist()[::2] == key_groups_of(
        pa.array(["a", "b"]), 120
    ).tolist()


def test_empty_key_arrays() -> None:
    for keys in (pa.array([], pa.string()), pa.array([], pa.int64()), pa.chunked_array([], pa.int64()), np.array([])):
        groups = key_groups_of(keys, 120)
        assert groups.shape == (0,)
        assert groups.dtype == np.int64


@pytest.mark.parametrize("kind", ["str", "int"])
@pytest.mark.parametrize("max_parallelism", [120, 128])
def test_distinct_keys_spread_evenly(kind: str, max_parallelism: int) -> None:
    n = 10_000
    keys = np.array([f"user-{i}" for i in range(n)], dtype=object) if kind == "str" else np.arange(n, dtype=np.int64)
    counts = np.bincount(key_groups_of(keys, max_parallelism), minlength=max_parallelism)
    assert counts.sum() == n
    expected = n / max_parallelism
    # Chi-square with maxParallelism-1 degrees of freedom: mean ~119, sd ~15.
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 2 * max_parallelism, chi2
    assert counts.min() > expected / 2 and counts.max() < expected * 1.6
    # Range assignment then balances instances too.
    assignment = Assignment.ranges(7, max_parallelism)
    per_instance = np.bincount(np.array(assignment.owners)[key_groups_of(keys, max_parallelism)], minlength=7)
    assert per_instance.max() / per_instance.min() < 1.25


# --- runs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key_groups", "expected"),
    [
        ([], []),
        ([5], [(5, 5)]),
        ([0, 1, 2, 3], [(0, 3)]),
        ([0, 2, 4], [(0, 0), (2, 2), (4, 4)]),
        ((7, 8, 1, 2, 3, 5), [(1, 3), (5, 5), (7, 8)]),
        ([119, 0], [(0, 0), (119, 119)]),
    ],
)
def test_runs(key_groups: list[int], expected: list[tuple[int, int]]) -> None:
    assert runs(key_groups) == expected


def test_runs_of_a_range_assignment_are_one_run_per_instance() -> None:
    assignment = Assignment.ranges(7, 120)
    for instance in range(7):
        r = range_of_instance(instance, 7, 120)
        assert runs(assignment.owned_by(instance)) == [(r.start, r.stop - 1)]


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 300), max_size=80))
def test_runs_round_trip(key_groups: set[int]) -> None:
    out = runs(list(key_groups))
    expanded = [kg for lo, hi in out for kg in range(lo, hi + 1)]
    assert expanded == sorted(key_groups)
    for lo, hi in out:
        assert lo <= hi
    # Maximal: consecutive runs are separated by at least one missing key group.
    for (_, hi), (lo, _) in zip(out, out[1:]):
        assert lo > hi + 1


def test_a_key_of_several_columns_routes_equal_tuples_alike_whatever_the_column_names() -> None:
    from streamjobs_core.keygroups import key_groups_of_columns

    left = pa.table({"seller": pa.array([1, 2, 3, 1], pa.int32()), "region": ["eu", "us", "eu", "us"]})
    right = pa.table({"region": ["us", "eu", "eu", "us"], "id": [1, 1, 3, 2]})
    a = key_groups_of_columns(left, ("seller", "region"), 128)
    b = key_groups_of_columns(right, ("id", "region"), 128)
    assert a.tolist() == [b[1], b[3], b[2], b[0]]
    assert key_groups_of_columns(left, ("seller",), 128).tolist() == key_groups_of(left.column("seller"), 128).tolist()
    swapped = key_groups_of_columns(left, ("region", "seller"), 1 << 20)
    assert swapped.tolist() != key_groups_of_columns(left, ("seller", "region"), 1 << 20).tolist()


def test_string_keys_that_repeat_or_not_and_nulls_hash_as_each_key_alone() -> None:
    # Repeating keys are hashed once per distinct value, mostly distinct ones one by one: same groups either way.
    repeating = [WORDS[i % 7] if i % 11 else None for i in range(10_000)]
    distinct = [f"id-{i}" if i % 13 else None for i in range(10_000)]
    for keys in (repeating, distinct, [None, None], []):
        expected = key_groups_of(np.array(keys, dtype=object), 128).tolist()
        assert key_groups_of(pa.array(keys, pa.string()), 128).tolist() == expected
        assert key_groups_of(pa.array(keys, pa.large_string()), 128).tolist() == expected
        halves = pa.chunked_array([pa.array(keys[:len(keys) // 2], pa.string()), pa.array(keys[len(keys) // 2:], pa.string())])
        assert key_groups_of(halves, 128).tolist() == expected
    as_bytes = [k.encode() if k is not None else None for k in repeating]
    assert key_groups_of(pa.array(as_bytes, pa.binary()), 128).tolist() == key_groups_of(
        np.array(as_bytes, dtype=object), 128).tolist()
