"""A stage's keyed state made durable through the memory exchange (a job in one process) restores exactly: the
worker's own checkpoint and recovery, with no Redis."""

from __future__ import annotations

import pyarrow as pa
import pytest
from streamjobs_core.exchange import Fenced, MemoryExchange, Transaction
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.keygroups import Assignment
from streamjobs_core.layout import JobKeys
from streamjobs_worker import recovery
from streamjobs_worker.state import KG, KeyGroupStore, StateLayout, replace_rows
from streamjobs_worker.transaction import Checkpoint

KEYS = JobKeys("mem")


def put(store: KeyGroupStore, kg: int, key: str, value: int) -> None:
    row = pa.table({"k": [key], "v": pa.array([value], pa.int64()), KG: pa.array([kg], pa.int64())})
    store.update(0, [kg], lambda current: (replace_rows(current, row, None, "k"), row, None))


def state(store: KeyGroupStore, kg: int) -> dict:
    table = store.table(kg)
    return {} if table is None else dict(zip(table.column("k").to_pylist(), table.column("v").to_pylist()))


def test_state_committed_snapshotted_and_committed_again_restores_and_a_replaced_worker_writes_nothing():
    jobs = MemoryJobStore()
    jobs.write_assignment("op", Assignment(1, (0, 0)))
    exchange = MemoryExchange(jobs, KEYS)
    store = KeyGroupStore([0, 1], layout=StateLayout(key="k"))
    checkpoint = Checkpoint(exchange, KEYS, "op", 0, jobs.new_incarnation("op", 0), store, snapshot_every_batches=2)
    put(store, 0, "a", 1)
    put(store, 1, "b", 2)
    checkpoint.complete(Transaction(), {}, lambda released: None)
    put(store, 0, "a", 5)
    assert checkpoint.complete(Transaction(), {}, lambda released: None) > 0  # the second batch snapshots
    assert exchange.length([KEYS.changelog("op", 0)]) == [0]  # the snapshot trimmed what it covers
    put(store, 1, "c", 7)
    checkpoint.complete(Transaction(), {}, lambda released: None)

    restored = KeyGroupStore([0, 1], layout=StateLayout(key="k"))
    assert recovery.restore(exchange, KEYS, "op", restored) == checkpoint.changelog_ids
    assert state(restored, 0) == {"a": 5} and state(restored, 1) == {"b": 2, "c": 7}

    jobs.new_incarnation("op", 0)  # restarted: the old worker's next batch is fenced, its state unchanged
    put(store, 0, "a", 9)
    with pytest.raises(Fenced):
        checkpoint.complete(Transaction(), {}, lambda released: None)
    again = KeyGroupStore([0, 1], layout=StateLayout(key="k"))
    recovery.restore(exchange, KEYS, "op", again)
    assert state(again, 0) == {"a": 5}
