"""Batches are event-driven: an idle instance wakes when input arrives, and watermarks travel in the commit
of the batch that advanced them (no heartbeat timer stands between a watermark and a window's firing)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
from streamjobs_core.codec import decode, encode
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_worker.ports import Ports
from streamjobs_worker.worker import Worker


def deploy(r, stages, sinks, **spec) -> JobPlan:
    job = parse_job({"metadata": {"name": "ev"}, "spec": {
        "maxParallelism": 4, "sources": [{"name": "words", "type": "zipf", "rate": {"recordsPerSecond": 200}}],
        "stages": stages, "sinks": sinks, **spec}})
    plan = JobPlan(job, int(time.time() * 1000))
    RedisJobStore(r, plan.name).deploy(plan)
    return plan


def test_every_stream_hears_a_new_watermark_in_the_commit_that_advanced_it(r):
    plan = deploy(r, [], [{"name": "out", "type": "redis_stream", "inputs": ["words"], "chain": False}])
    source = Worker(Ports.over_redis(r, plan.id), plan, "words", 0)
    source.restore()
    for _ in range(3):
        source.step()
        marks = []
        for kg in range(4):
            (_, fields), = r.xrevrange(plan.keys.kg_stream("words", "out", kg), count=1)
            marks.append(decode(fields).watermark)
        assert marks == [source.input.watermark] * 4  # with data or as a heartbeat, never a tick behind


def test_an_idle_window_stage_blocks_until_input_arrives_and_fires_on_its_watermark(r, spark):
    window = {"name": "count", "type": "window_aggregate", "inputs": ["words"], "keyBy": "word", "chain": False,
              "window": {"sizeMs": 1000}, "aggregations": [{"function": "count", "as": "n"}]}
    plan = deploy(r, [window], [{"name": "out", "type": "redis_stream", "inputs": ["count"], "chain": False}],
                  batching={"maxWaitMs": 30_000, "minIntervalMs": 60_000})
    stage = Worker(Ports.over_redis(r, plan.id), plan, "count", 0)
    stage.restore()

    def produce(watermark: int, rows: dict | None) -> None:
        for kg in range(4):
            table = pa.table(rows) if rows and kg == 0 else None
            r.xadd(plan.keys.kg_stream("words", "count", kg), encode(table, watermark, [(0, 3)]))  # all partitions

    def fired() -> int:  # result records downstream (a batch may also send the new watermark on, as an entry)
        return sum(decode(f).records for kg in range(4) for _, f in r.xrange(plan.keys.kg_stream("count", "out", kg)))

    rows = {"word": ["a", "b", "a"], "event_time": [100, 200, 300], "_ingest_ms": [0, 0, 0]}
    threading.Timer(0.5, produce, (999, rows)).start()
    started = time.monotonic()
    stage.step()  # blocks on the empty streams, wakes with the records: no window has ended, nothing fires
    assert time.monotonic() - started < 25, "woke on arrival, not at maxWaitMs"
    assert fired() == 0
    threading.Timer(0.5, produce, (1000, None)).start()  # the watermark passes the window's end
    while fired() < 2 and time.monotonic() - started < 25:  # each key group fires as its watermark arrives
        stage.step()
    assert fired() == 2  # ("a", 2) and ("b", 1) fired once their window ended, not on a timer
