"""A batch's commit through the exchange behaves the same over a real Redis and in memory (one contract, both):
every write or none, fenced by the writer's incarnation and its operator's assignment generation."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from streamjobs_core.exchange import Fence, Fenced, MemoryExchange, RedisExchange, RowEntries, Transaction
from streamjobs_core.jobstore import MemoryJobStore, RedisJobStore
from streamjobs_core.keygroups import Assignment
from streamjobs_core.layout import JobKeys
from streamjobs_core.statelog import read_changes
from streamjobs_worker.state import KG, KeyGroupStore, StateLayout, replace_rows

OP = "op"


@pytest.fixture(params=["redis", "memory"])
def exchange(request):
    """(the exchange, its job store) with `op`'s assignment in force."""
    if request.param == "memory":
        jobs = MemoryJobStore()
        exchange = MemoryExchange(jobs, JobKeys("x"))
    else:
        jobs = RedisJobStore(request.getfixturevalue("r"), "x")
        exchange = RedisExchange(jobs.r, jobs)
    jobs.write_assignment(OP, Assignment(1, (0, 0, 1, 1)))
    return exchange, jobs


def fence(jobs, instance: int = 0) -> Fence:
    return Fence(OP, instance, jobs.new_incarnation(OP, instance))


def changes(kg: int, key: str) -> list:
    store = KeyGroupStore([kg], layout=StateLayout(key="k"))
    row = pa.table({"k": [key], "v": pa.array([1], pa.int64()), KG: pa.array([kg], pa.int64())})
    store.update(0, [kg], lambda current: (replace_rows(current, row, None, "k"), row, None))
    return store.drain_changes()[kg]


def a_batch(n: int) -> Transaction:
    txn = Transaction()
    txn.xadd("out", {"n": n})
    txn.hincrby("counts", "in", 2)
    txn.hset("offsets", {"p0": f"{n}-0"})
    return txn


def test_a_commit_applies_every_write_and_names_its_changelog_entries(exchange):
    exchange, jobs = exchange
    writer = fence(jobs)
    exchange.commit(a_batch(1), writer)
    txn = a_batch(2)
    txn.changelog.update({2: changes(2, "a"), 0: changes(0, "b")})
    txn.rows.append(RowEntries("sink", ["word", "n"], [["x", "y"], ["1", None]], None))
    txn.values["snapshot"] = b"rows"
    txn.rpushes.append(("manifest", "part-1"))
    txn.sadds.append(("done", "0"))
    ids = exchange.commit(txn, writer)
    keys = JobKeys("x")
    assert set(ids) == {0, 2}
    for kg, key in ((0, "b"), (2, "a")):
        (entry_id, fields), = exchange.after({keys.changelog(OP, kg): None})[keys.changelog(OP, kg)]
        assert entry_id == ids[kg] and read_changes(fields).upserts.column("k").to_pylist() == [key]
    assert [f for _, f in exchange.after({"out": None})["out"]] == [{b"n": b"1"}, {b"n": b"2"}]
    assert [f for _, f in exchange.after({"sink": None})["sink"]] == [{b"word": b"x", b"n": b"1"}, {b"word": b"y"}]
    assert exchange.hashes(["counts", "offsets"]) == [{b"in": b"4"}, {b"p0": b"2-0"}]
    assert exchange.hash_fields("offsets", ["p1", "p0"]) == [None, b"2-0"]
    assert exchange.value("snapshot") == b"rows" and exchange.items("manifest") == [b"part-1"]
    assert exchange.members("done") == {b"0"}

    newest, _ = exchange.newest(["out"])[0]
    txn = Transaction(trims={"out": newest}, deletes=["counts"], hdels=[("offsets", ("p0",))])
    exchange.commit(txn, writer)
    # A commit's trim keeps what follows its id (Redis trims whole nodes: maybe more, never less).
    assert exchange.after({"out": None})["out"][-1] == (newest, {b"n": b"2"})
    assert exchange.hashes(["counts", "offsets"]) == [{}, {}]


def test_a_replaced_incarnation_commits_nothing(exchange):
    exchange, jobs = exchange
    old = fence(jobs)
    exchange.commit(a_batch(1), old)
    new = fence(jobs)  # the instance restarted
    txn = a_batch(2)
    txn.changelog[1] = changes(1, "z")
    with pytest.raises(Fenced, match="superseded"):
        exchange.commit(txn, old)
    assert exchange.length(["out", JobKeys("x").changelog(OP, 1)]) == [1, 0]
    assert exchange.hashes(["counts"]) == [{b"in": b"2"}]
    exchange.commit(a_batch(3), new)
    assert exchange.length(["out"]) == [2]


def test_a_new_generation_fences_and_a_switch_that_keeps_it_does_not(exchange):
    exchange, jobs = exchange
    writer = fence(jobs)
    exchange.commit(a_batch(1), writer)
    jobs.write_assignment(OP, Assignment(2, (0, 1, 1, 1)), generation=1)  # a stepwise switch keeps generation 1
    exchange.commit(a_batch(2), writer)
    jobs.write_assignment(OP, Assignment(3, (1, 1, 1, 1)))  # a revoking rescale: generation 3
    with pytest.raises(Fenced, match="reassigned"):
        exchange.commit(a_batch(3), writer)
    assert exchange.length(["out"]) == [2]


def test_no_commit_applies_after_the_incarnation_that_fences_it(exchange):
    """A writer commits in a loop while its successor starts: every batch is in before the new incarnation or
    fenced, none lands after it (WATCH and MULTI/EXEC in Redis, one lock with the job store in memory)."""
    exchange, jobs = exchange
    old = fence(jobs)
    fenced = threading.Event()

    def commit_until_fenced() -> None:
        n = 0
        while True:
            try:
                exchange.commit(a_batch(n), old)
            except Fenced:
                fenced.set()
                return
            n += 1

    writer = threading.Thread(target=commit_until_fenced)
    writer.start()
    while exchange.length(["out"]) == [0]:
        time.sleep(0.001)
    fence(jobs)
    at_fence = exchange.length(["out"])[0]
    writer.join(timeout=30)
    assert fenced.is_set()
    assert exchange.length(["out"])[0] == at_fence > 0
