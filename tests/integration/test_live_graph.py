"""A stage added live to the sources' chain, against a real redis-server: a source worker started while the
version is published but before its partitions switched runs the chain they are at, then switches, builds the
new member and feeds the new tail's streams; the consumer takes those in its switching commit and deletes the
old ones. No record is lost or read twice on the way."""

from __future__ import annotations

import time

from streamjobs_core.control import ReconfigureState
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_worker.ports import Ports
from streamjobs_worker.worker import Worker

OUT = {"name": "out", "type": "redis_stream", "inputs": ["words"], "chain": False}
MARK = {"name": "mark", "type": "sql", "inputs": ["words"], "query": "SELECT * FROM input"}


def job(stages, sinks):
    return parse_job({"metadata": {"name": "graph"}, "spec": {
        "maxParallelism": 4, "sources": [{"name": "words", "type": "zipf", "rate": {"recordsPerSecond": 400}}],
        "stages": stages, "sinks": sinks}})


def test_a_stage_added_to_the_sources_chain_renames_the_streams_at_one_cut(r, spark):
    jobs = RedisJobStore(r, "graph")
    first = JobPlan(job([], [OUT]), int(time.time() * 1000))
    jobs.deploy(first)
    sink = Worker(Ports.over_redis(r, first.id), first, "out", 0)
    sink.restore()
    jobs.publish_plan(JobPlan(job([MARK], [{**OUT, "inputs": ["mark"]}]), first.t0_ms, 1),
                      ReconfigureState(1, time.time(), ("spec.stages[mark]: live",)))

    published = jobs.plan()
    source = Worker(Ports.over_redis(r, published.id), published, "words", 0)  # as if restarted after the publish
    assert (source.plan.version, source.chain.chain.operators) == (0, ("words",))
    source.restore()
    deadline = time.monotonic() + 60
    while source.plan.version == 0 and time.monotonic() < deadline:
        source.step()
    assert source.chain.chain.operators == ("words", "mark")
    old = [first.keys.kg_stream("words", "out", kg) for kg in range(4)]
    new = [first.keys.kg_stream("mark", "out", kg) for kg in range(4)]
    for _ in range(3):
        source.step()
    assert all(r.xlen(name) > 0 for name in new)

    while sink.plan.version == 0 and time.monotonic() < deadline:
        sink.step()
    assert not r.exists(*old), "the old streams went in the switching commit"
    assert jobs.streams("out", old) == [(None, None)] * 4  # nor their progress
    emitted = int(r.hget(first.keys.counts, "words:out"))  # the source steps no more
    output = first.keys.output_stream("out")
    while r.xlen(output) < emitted and time.monotonic() < deadline:
        sink.step()
    for _ in range(3):
        sink.step()
    assert r.xlen(output) == emitted and int(r.hget(first.keys.counts, "mark:in")) > 0
