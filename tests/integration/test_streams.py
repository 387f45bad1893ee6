"""The exchange's record streams behave the same over a real Redis and in memory (one contract, both)."""

from __future__ import annotations

import threading
import time

import pytest
from streamjobs_core.exchange import MemoryStreams, RedisStreams, entry_order, next_entry


@pytest.fixture(params=["redis", "memory"])
def streams(request):
    if request.param == "memory":
        return MemoryStreams()
    return RedisStreams(request.getfixturevalue("r"))


def test_ids_grow_and_a_read_takes_what_follows_its_cursor_in_order(streams):
    ids = [streams.append("s", {"n": n, "tag": "x"}) for n in range(5)]
    assert [entry_order(i) for i in ids] == sorted({entry_order(i) for i in ids})
    (name, entries), = streams.read({"s": b"0-0"}, count=3)
    assert name == "s" and [e for e, _ in entries] == ids[:3]
    assert entries[0][1] == {b"n": b"0", b"tag": b"x"}
    (_, rest), = streams.read({"s": ids[2]}, count=10)
    assert [fields[b"n"] for _, fields in rest] == [b"3", b"4"]
    assert streams.read({"s": ids[-1]}, count=10) == []


def test_a_read_over_several_streams_answers_for_those_with_entries_only(streams):
    a = streams.append("a", {"v": b"1"})
    streams.append("b", {"v": b"2"})
    answered = dict(streams.read({"a": a, "b": b"0-0", "missing": b"0-0"}, count=5))
    assert list(answered) == ["b"] and answered["b"][0][1] == {b"v": b"2"}
    assert streams.read({}, count=5, block_ms=5_000) == []  # nothing to wait for


def test_a_blocked_read_wakes_on_an_append_from_another_thread_and_times_out_without_one(streams):
    started = time.monotonic()
    assert streams.read({"s": b"0-0"}, count=1, block_ms=200) == []
    assert time.monotonic() - started >= 0.15

    appender = threading.Timer(0.2, lambda: streams.append("s", {"v": b"late"}))
    appender.start()
    started = time.monotonic()
    (_, entries), = streams.read({"s": b"0-0"}, count=1, block_ms=5_000)
    assert entries[0][1] == {b"v": b"late"} and time.monotonic() - started < 2.5
    appender.join()


def test_entries_by_id_after_an_id_and_the_newest(streams):
    ids = [streams.append("s", {"n": n}) for n in range(3)]
    assert streams.at({"s": ids[1], "other": ids[1]}) == {"s": {b"n": b"1"}, "other": None}
    after = streams.after({"s": ids[0], "t": None})
    assert [e for e, _ in after["s"]] == ids[1:] and after["t"] == []
    assert [e for e, _ in streams.after({"s": None})["s"]] == ids
    assert streams.newest(["s", "t"]) == [(ids[2], {b"n": b"2"}), None]
    assert streams.length(["s", "t"]) == [3, 0]


def test_a_trim_drops_what_is_below_its_id_and_ids_go_on_growing_after_it(streams):
    ids = [streams.append("s", {"n": n}) for n in range(4)]
    assert streams.trim("s", next_entry(ids[1])) == 2
    assert [e for e, _ in streams.after({"s": None})["s"]] == ids[2:]
    assert streams.at({"s": ids[0]}) == {"s": None}
    assert streams.trim("s", next_entry(ids[-1])) == 2 and streams.length(["s"]) == [0]
    again = streams.append("s", {"n": 4})
    assert entry_order(again) > entry_order(ids[-1])  # an emptied stream does not give an id twice


def test_appends_with_a_length_keep_at_least_the_newest(streams):
    ids = [streams.append("s", {"n": n}, maxlen=10) for n in range(300)]
    kept = [e for e, _ in streams.after({"s": None})["s"]]
    assert kept[-10:] == ids[-10:] and len(kept) < 300  # Redis trims whole nodes: at least the newest 10 stay


def test_concurrent_appenders_are_read_once_each_in_id_order(streams):
    def produce(who: int) -> None:
        for n in range(200):
            streams.append("s", {"who": who, "n": n})

    producers = [threading.Thread(target=produce, args=(who,)) for who in range(4)]
    for p in producers:
        p.start()
    seen, cursor, deadline = [], b"0-0", time.monotonic() + 20
    while len(seen) < 800 and time.monotonic() < deadline:
        for _, entries in streams.read({"s": cursor}, count=64, block_ms=500):
            seen.extend(entries)
            cursor = entries[-1][0]
    for p in producers:
        p.join()
    assert [entry_order(e) for e, _ in seen] == sorted(entry_order(e) for e, _ in seen)
    for who in range(4):  # each producer's entries once, in the order it added them
        assert [int(f[b"n"]) for _, f in seen if f[b"who"] == str(who).encode()] == list(range(200))


def test_entry_ids_order_as_pairs():
    assert entry_order(b"5-10") > entry_order(b"5-9") > entry_order("4-99") and entry_order(b"7") == (7, 0)
    assert next_entry(b"5-9") == b"5-10"
