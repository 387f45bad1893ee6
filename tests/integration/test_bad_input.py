"""Each kind of bad input ends in the job's dead-letter stream with its reason; the good records flow on.

In-process workers (source, Spark SQL stage, sink) stepped by hand against a real redis-server.
"""

from __future__ import annotations

import time

import pytest
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_worker.ports import Ports
from streamjobs_worker.worker import Worker


def deploy(r, on_error: str) -> JobPlan:
    job = parse_job({
        "metadata": {"name": "bad"},
        "spec": {
            "maxParallelism": 4,
            "sources": [{"name": "in", "type": "redis_stream", "eventTimeField": "t"}],
            # Not chained: each bad input kind is met by its own worker, the kg stream's decoding included.
            "stages": [{"name": "twice", "type": "sql", "inputs": ["in"], "onError": on_error, "chain": False,
                        "query": "SELECT k, CAST(n AS INT) * 2 AS n2, event_time, _ingest_ms FROM input"}],
            "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["twice"]}],
        },
    })
    plan = JobPlan(job, int(time.time() * 1000))
    RedisJobStore(r, plan.name).deploy(plan)
    return plan


def feed(r, plan) -> None:
    stream = plan.keys.input_stream("in", 0)
    for k, n, t in (("a", "1", "1000"), ("b", "x", "1001"), ("c", "3", "soon"), ("d", "4", "1002")):
        r.xadd(stream, {"k": k, "n": n, "t": t})
    r.xadd(plan.keys.kg_stream("in", "twice", 0), {"m": b"\xc1 not msgpack"})  # an undecodable entry


def test_every_kind_of_bad_record_is_dead_lettered_with_its_reason_and_the_rest_is_exact(r, spark):
    plan = deploy(r, "dead_letter")
    feed(r, plan)
    workers = [Worker(Ports.over_redis(r, plan.id), plan, op, 0) for op in ("in", "twice", "out")]
    for worker in workers:
        worker.restore()
    for _ in range(3):
        for worker in workers:
            worker.step()
    rows = [{k.decode(): v for k, v in f.items()} for _, f in r.xrange(plan.keys.dead_letter)]
    reasons = {row["operator"].decode(): row["error"].decode() for row in rows}
    assert len(rows) == 3
    assert "bad event time field" in reasons["in"]
    undecodable, cast = sorted((row for row in rows if row["operator"] == b"twice"), key=lambda x: x["id"] == b"")
    assert undecodable["stream"] == plan.keys.kg_stream("in", "twice", 0).encode()
    assert b"undecodable" in undecodable["error"]
    assert cast["stream"] == b"in>twice" and b'"n": "x"' in cast["record"] and b"CAST" in cast["error"].upper()
    out = sorted((f[b"k"], int(f[b"n2"])) for _, f in r.xrange(plan.keys.output_stream("out")))
    assert out == [(b"a", 2), (b"d", 8)]
    dead = workers[1].metrics.registry.get_sample_value(
        "streamjobs_dead_letters_total", {"job": "bad", "operator": "twice", "instance": "0"})
    assert dead == 2


def test_on_error_fail_stops_the_worker_and_commits_nothing(r, spark):
    plan = deploy(r, "fail")
    feed(r, plan)
    ports = Ports.over_redis(r, plan.id)
    source, stage = Worker(ports, plan, "in", 0), Worker(ports, plan, "twice", 0)
    source.restore()
    stage.restore()
    source.step()
    with pytest.raises(Exception, match="CAST"):
        for _ in range(4):  # the first batches may hold no record of the poisoned entry yet
            stage.step()
    assert sum(r.xlen(plan.keys.kg_stream("twice", "out", kg)) for kg in range(4)) == 0  # nothing committed
