"""A worker's input reads its kg streams through the exchange's port: here the memory exchange, in one process."""

from __future__ import annotations

import threading

import pyarrow as pa
from streamjobs_core.codec import encode, encode_marker
from streamjobs_core.exchange import Fence, MemoryExchange, MemoryStreams, Transaction
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_worker.inputs import StreamInput

from ..jobs.control import control_plan


def write(streams, plan, kg: int, values: list[int], watermark: int) -> None:
    table = pa.table({"v": pa.array(values, pa.int64())})
    streams.append(plan.keys.kg_stream("src", "agg", kg), encode(table, watermark, [(0, 11)]))


def values(batch) -> list[int]:
    table = batch.table("src")
    return [] if table is None else sorted(table.column("v").to_pylist())


def test_the_input_reads_owned_streams_up_to_a_marker_and_its_watermarks_over_memory():
    plan, jobs = control_plan(), MemoryJobStore()
    streams = MemoryExchange(jobs, plan.keys)
    write(streams, plan, 3, [1, 2], 100)
    write(streams, plan, 2, [10], 100)
    write(streams, plan, 5, [99], 100)  # not owned
    streams.append(plan.keys.kg_stream("src", "agg", 3), encode_marker(1))
    write(streams, plan, 3, [3], 900)  # the new owner's
    write(streams, plan, 2, [11], 900)
    reader = StreamInput(streams, jobs, plan, "agg", 0, (2, 3))
    reader.restore()
    batch = reader.read(0, count=100)
    assert values(batch) == [1, 2, 10, 11] and batch.records == 4
    assert reader.handovers() == {3: 1}
    assert batch.watermarks == {2: 900, 3: 100}
    assert values(reader.read(0, count=100)) == []  # read once; the parked stream not again

    txn = Transaction()
    reader.add_progress(txn)  # the cursors, kept by the memory store when the commit applies
    streams.commit(txn, Fence("agg", 0, jobs.new_incarnation("agg", 0)))
    write(streams, plan, 2, [12], 950)
    restarted = StreamInput(streams, jobs, plan, "agg", 0, (2, 3))
    restarted.restore()
    assert values(restarted.read(0, count=100)) == [12]  # after the committed cursors; 3 still parked
    assert restarted.handovers() == {3: 1}


def test_a_blocked_read_ends_when_a_producer_thread_appends():
    plan, streams = control_plan(), MemoryStreams()
    reader = StreamInput(streams, MemoryJobStore(), plan, "agg", 0, (4,))
    reader.restore()
    producer = threading.Timer(0.1, write, args=(streams, plan, 4, [7], 500))
    producer.start()
    batch = reader.read(5_000)
    producer.join()
    assert values(batch) == [7] and batch.watermarks[4] == 500 and batch.waited_s < 2.5
