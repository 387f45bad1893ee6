"""`streamjobs bench throughput`: a keyed windowed count at saturation, ours vs Spark Structured Streaming.

Ours: the input is first written to the kg streams by a real source worker
(generation is not part of the measurement); then one window_aggregate worker,
run in this process on a one-core SparkSession, consumes the whole backlog
through its normal read -> Spark -> merge -> commit loop. The peer is the same
keyed tumbling-window count in Spark Structured Streaming on its rate source,
on the same one-core session, writing to the noop sink. Both rates are
records per second of wall time over the measured stretch, warm-up excluded.
Apache Flink, the second peer, runs the same query in Flink SQL on a local
mini-cluster pinned to one core (flink_peer.py; its steady rate, job start
excluded), when the optional `bench` extra is installed.
Latency is `streamjobs bench latency`'s (latency.py).
"""

from __future__ import annotations

import time

import redis
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_worker.worker import Worker

from ..redis_server import RedisServer
from .sss_peer import measure_peer

VOCABULARY = 1000


def _count_job(records: int) -> JobPlan:
    job = parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "bench-throughput"},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "vocabulary": VOCABULARY, "totalRecords": records,
                         "rate": {"recordsPerSecond": 1e9}}],
            "stages": [{"name": "count", "type": "window_aggregate", "inputs": ["words"], "keyBy": "word",
                        "window": {"sizeMs": 1000}, "aggregations": [{"function": "count", "as": "n"}]}],
            "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["count"]}],
            # The whole input is written before the stage starts: backpressure must not stop the source.
            "batching": {"maxRecords": 500_000, "maxLagRecords": records + 1},
        },
    })
    return JobPlan(job, int(time.time() * 1000))


def _prefill(r: redis.Redis, plan: JobPlan) -> int:
    """Write the whole input with a real source worker; return Redis bytes used per record."""
    RedisJobStore(r, plan.id).deploy(plan)
    before = r.info("memory")["used_memory"]
    source = Worker(r, plan, "words", 0)
    source.restore()
    while not source.input.finished:
        source.step()
    records = plan.spec.sources[0].total_records
    return (r.info("memory")["used_memory"] - before) / records


def measure_ours(r: redis.Redis, plan: JobPlan) -> dict:
    bytes_per_record = _prefill(r, plan)
    records = plan.spec.sources[0].total_records
    stage = Worker(r, plan, "count", 0)
    stage.restore()
    stage.step()  # first batch pays one-off costs
    consumed_key = plan.keys.consumed("words", "count")
    start_count = sum(int(v) for v in r.hvals(consumed_key))
    started = time.monotonic()
    while sum(int(v) for v in r.hvals(consumed_key)) < records:
        stage.step()
    elapsed = time.monotonic() - started
    return {
        "ours_records_per_s": (records - start_count) / elapsed,
        "ours_measured_records": records - start_count,
        "ours_measured_s": elapsed,
        "redis_bytes_per_record": bytes_per_record,
    }


def run(quick: bool) -> dict:
    from streamjobs_worker import spark as worker_spark

    records = 2_000_000 if quick else 6_000_000  # ours: 5-10 batches of up to 500k after the first
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        spark = worker_spark.session("local[1]", "2g")
        ours = measure_ours(r, _count_job(records))
    peer = measure_peer(spark, rows_per_batch=200_000, batches=8 if quick else 24, vocabulary=VOCABULARY)
    result = {"cores": 1, "records": records, **ours, **peer}
    result["ratio"] = result["ours_records_per_s"] / result["peer_records_per_s"]
    from .latency import FLINK_MISSING, flink_peer

    flink = flink_peer()
    if flink is None:
        result["flink"] = FLINK_MISSING
    else:
        result.update(flink.measure_throughput(5_000_000 if quick else 20_000_000, VOCABULARY, cores=1))
        result["flink_ratio"] = result["ours_records_per_s"] / result["flink_records_per_s"]
    return result
