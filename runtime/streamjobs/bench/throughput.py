"""`streamjobs bench throughput`: a keyed windowed count at saturation, ours vs Spark Structured Streaming.

Ours: the input is first written to the kg streams by a real source worker
(generation is not part of the measurement); then one window_aggregate worker,
run in this process on a one-core SparkSession, consumes the whole backlog
through its normal read -> Spark -> merge -> commit loop. The peer is the same
keyed tumbling-window count in Spark Structured Streaming on its rate source,
on the same one-core session, writing to the noop sink. Both rates are
records per second of wall time over the measured stretch, warm-up excluded.
Latency is measured separately on the local runtime at half the measured
saturation rate for a three-stage job (NEXMark Q5).
"""

from __future__ import annotations

import shutil
import tempfile
import time

import redis
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan, write_assignment
from streamjobs_worker.worker import Worker

from ..redis_server import RedisServer

VOCABULARY = 1000
LIGHT_LOAD_RECORDS_PER_S = 2000


def _count_job(records: int) -> JobPlan:
    job = parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "bench-throughput"},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "vocabulary": VOCABULARY, "totalRecords": records,
                         "rate": {"recordsPerSecond": 1e9}}],
            "stages": [{"name": "count", "type": "window_aggregate", "inputs": ["words"], "keyBy": "word",
                        "window": {"sizeMs": 1000}, "aggregations": [{"function": "count", "as": "n"}]}],
            "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["count"]}],
            "batching": {"maxRecords": 500_000},
        },
    })
    return JobPlan(job, int(time.time() * 1000))


def _prefill(r: redis.Redis, plan: JobPlan) -> int:
    """Write the whole input with a real source worker; return Redis bytes used per record."""
    for op in plan.spec.operators:
        write_assignment(r, plan.keys, op.name, plan.initial_assignment(op.name))
    before = r.info("memory")["used_memory"]
    source = Worker(r, plan, "words", 0)
    source.restore()
    while not source.source.finished:
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


def measure_peer(spark: SparkSession, rows_per_batch: int, batches: int) -> dict:
    stream = (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 1).option("advanceMillisPerBatch", 1000).load()
    )
    counts = (
        stream.select(F.concat(F.lit("w"), (F.col("value") % VOCABULARY).cast("string")).alias("word"), "timestamp")
        .withWatermark("timestamp", "0 seconds")
        .groupBy(F.window("timestamp", "1 second"), "word").count()
    )
    checkpoint = tempfile.mkdtemp(prefix="streamjobs-peer-")
    query = (
        counts.writeStream.format("noop").outputMode("append").option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds").start()
    )
    try:
        while len(query.recentProgress) < batches + 2:
            if query.exception() is not None:
                raise RuntimeError(f"peer query failed: {query.exception()}")
            time.sleep(0.5)
    finally:
        query.stop()
        query.awaitTermination()
        shutil.rmtree(checkpoint, ignore_errors=True)
    progress = [p for p in query.recentProgress if p["numInputRows"]][2:]  # skip warm-up batches
    rows = sum(p["numInputRows"] for p in progress)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    return {"peer_records_per_s": rows / seconds, "peer_measured_records": rows, "peer_measured_s": seconds}


def _q5_job(rate: float) -> dict:
    return {
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "bench-latency"},
        "spec": {
            "sources": [{"name": "events", "type": "nexmark", "activeAuctions": 200, "outOfOrderMs": 100,
                         "rate": {"recordsPerSecond": rate}}],
            "stages": [
                {"name": "bids-per-auction", "type": "window_aggregate", "inputs": ["events"],
                 "where": "event_type = 2", "keyBy": "bid_auction",
                 "window": {"type": "sliding", "sizeMs": 4000, "slideMs": 1000},
                 "aggregations": [{"function": "count", "as": "bids"}]},
                {"name": "by-window", "type": "sql", "inputs": ["bids-per-auction"],
                 "query": "SELECT window_end AS slide_end, bids, event_time, _ingest_ms FROM input"},
                {"name": "hottest", "type": "window_aggregate", "inputs": ["by-window"], "keyBy": "slide_end",
                 "window": {"sizeMs": 1000}, "aggregations": [{"function": "max", "column": "bids", "as": "max_bids"}]},
            ],
            "sinks": [{"name": "hot-items", "type": "redis_stream", "inputs": ["hottest"]}],
        },
    }


def _run_q5(rate: float, duration_s: float) -> dict:
    from rich.console import Console

    from ..run import run_job

    return run_job(parse_job(_q5_job(rate)), duration_s, console=Console(quiet=True))


def measure_latency(duration_s: float) -> dict:
    """Three stages (window, sql, window) on the local runtime at half their saturation; e2e latency at the sink.

    Latency percentiles are over the second half of each run: the first batches
    pay Spark's query compilation and JIT warm-up, which the steady state does not.
    Saturation is what the first stage consumed per second while offered far more
    than it could take (backpressure holds the source back).
    """
    flood = _run_q5(1e6, duration_s / 2)
    saturation = flood["operators"]["bids-per-auction"]["records_in"] / flood["duration_s"]
    report = _run_q5(saturation / 2, duration_s)
    light = _run_q5(LIGHT_LOAD_RECORDS_PER_S, duration_s / 2)
    latency = report["latency_second_half_ms"]
    verification = report["verification"]
    return {
        "light_load_records_per_s": LIGHT_LOAD_RECORDS_PER_S,
        "light_load_p50_latency_ms": light["latency_second_half_ms"]["p50_ms"],
        "light_load_p99_latency_ms": light["latency_second_half_ms"]["p99_ms"],
        "pipeline_saturation_records_per_s": saturation,
        "latency_rate_records_per_s": saturation / 2,
        "p50_latency_ms": latency["p50_ms"],
        "p99_latency_ms": latency["p99_ms"],
        "latency_run_correct": verification["correct"],
        "latency_run_lost": verification["lost"],
        "latency_run_duplicated": verification["duplicated"],
    }


def run(quick: bool) -> dict:
    from streamjobs_worker import spark as worker_spark

    records = 600_000 if quick else 3_000_000
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        spark = worker_spark.session("local[1]", "2g")
        ours = measure_ours(r, _count_job(records))
    peer = measure_peer(spark, rows_per_batch=200_000, batches=4 if quick else 12)
    result = {"cores": 1, "records": records, **ours, **peer}
    result["ratio"] = result["ours_records_per_s"] / result["peer_records_per_s"]
    result.update(measure_latency(40 if quick else 120))
    return result
