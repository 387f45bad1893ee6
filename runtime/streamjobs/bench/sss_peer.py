"""The Spark Structured Streaming peers of the benchmarks: our queries written as a Spark user would.

Throughput: a keyed 1 s tumbling count on the `rate-micro-batch` source, noop sink.
Latency: NEXMark Q5 on the `rate` source (`rowsPerSecond` = the offered rate),
its two aggregations chained in one query (append mode, Spark's watermark
propagation), each result row stamped as it reaches a memory sink.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

# NEXMark's event mix (as core/streamjobs_core/generators.py): of every 50 events
# 1 person, 3 auctions, 46 bids; auction ids are consecutive from the first auction.
_CYCLE, _AUCTIONS_PER_CYCLE = 50, 3
_HOT_STRIDE = 100
# Independent draws per field; each is a hash of the row's index, so a batch
# replayed after a failure regenerates the same bids.
_SALT_JITTER, _SALT_HOT, _SALT_AUCTION = 1, 8, 9
_DRAW_RESOLUTION = 1 << 20
PEER_QUERY = "both aggregations and their join, chained in one query"
# Seen in its progress: the rate source releases whole seconds of rows, so a row
# waits up to 1 s (0.5 s on average) to enter a batch; that is part of the peer's latency.
PEER_SOURCE = "rate (rowsPerSecond = the rate; releases rows once per second of wall time)"


@dataclass(frozen=True)
class Q5Shape:
    """What the peer must match of our Q5 job; read from the job, never restated."""

    size_ms: int  # the sliding count's window
    slide_ms: int
    max_window_ms: int  # the tumbling max per window end
    active_auctions: int
    hot_auction_ratio: float
    out_of_order_ms: int  # the events' disorder bound, and the watermark delay


def session(cores: int, memory: str = "2g") -> SparkSession:
    """A local session as a Spark user would tune it for latency: one shuffle partition per core."""
    spark = (
        SparkSession.builder.master(f"local[{cores}]").appName("streamjobs-sss-peer")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", memory)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def measure_peer(spark: SparkSession, rows_per_batch: int, batches: int, vocabulary: int) -> dict:
    """Records per second of wall time of a keyed 1 s tumbling count over `vocabulary` words, from the start of
    the third batch to the end of the last (warm-up left out); the stretch's bounds in seconds since the epoch."""
    stream = (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 1).option("advanceMillisPerBatch", 1000).load()
    )
    counts = (
        stream.select(F.concat(F.lit("w"), (F.col("value") % vocabulary).cast("string")).alias("word"), "timestamp")
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
    start_s = _epoch_s(progress[0]["timestamp"])
    end_s = _epoch_s(progress[-1]["timestamp"]) + progress[-1]["durationMs"]["triggerExecution"] / 1000
    return {"records_per_s": rows / (end_s - start_s), "records": rows, "seconds": end_s - start_s,
            "start_s": start_s, "end_s": end_s}


def _epoch_s(timestamp: str) -> float:
    """A progress report's trigger start ('2026-11-27T13:25:01.123Z') in seconds since the epoch."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _draw(index: Column, salt: int) -> Column:
    """A float in [0, 1), a pure function of (index, salt)."""
    return F.pmod(F.xxhash64(index, F.lit(salt)), F.lit(_DRAW_RESOLUTION)) / _DRAW_RESOLUTION


def nexmark_bids(events: DataFrame, shape: Q5Shape) -> DataFrame:
    """(value, bid_auction, event_time) of the bids among a stream of (value, timestamp) event indices and times.

    The rules of our generator, with Spark's xxhash64 for its splitmix draws (so the
    same distribution, not the same ids): a bid goes with probability hot_auction_ratio
    to the newest auction whose id is a multiple of 100, else to one of the
    active_auctions newest; its event time lags its offered time by a uniform
    0..out_of_order_ms.
    """
    g = F.col("value")
    auctions = F.lit(_AUCTIONS_PER_CYCLE) * F.floor(g / _CYCLE) + _AUCTIONS_PER_CYCLE  # created before a bid
    hot_stride = min(_HOT_STRIDE, shape.active_auctions)
    hot = F.floor((auctions - 1) / hot_stride) * hot_stride
    cold = auctions - 1 - F.floor(_draw(g, _SALT_AUCTION) * F.least(auctions, F.lit(shape.active_auctions)))
    jitter_ms = F.floor(_draw(g, _SALT_JITTER) * (shape.out_of_order_ms + 1))
    return events.where(g % _CYCLE > _AUCTIONS_PER_CYCLE).select(
        g,
        F.when(_draw(g, _SALT_HOT) < shape.hot_auction_ratio, hot).otherwise(cold).cast("long").alias("bid_auction"),
        F.timestamp_millis(F.unix_millis("timestamp") - jitter_ms).alias("event_time"),
    )


def q5(bids: DataFrame, shape: Q5Shape) -> DataFrame:
    """Bids per auction in sliding windows, the max of each window end over tumbling windows, and the counts
    that equal their window's max (NEXMark Q5's hottest auctions), joined within the same instant.

    `window_time` (the window's last instant) is the first aggregation's event time,
    as ours gives its results `window_end - 1`; the second aggregation keys by the
    window end as ours keys by `slide_end`; the join's equal event times let Spark
    drop its state as the watermark passes.
    """
    counts = (
        bids.withWatermark("event_time", f"{shape.out_of_order_ms} milliseconds")
        .groupBy(F.window("event_time", f"{shape.size_ms} milliseconds", f"{shape.slide_ms} milliseconds"),
                 "bid_auction")
        .agg(F.count(F.lit(1)).alias("bids"))
        .select(F.window_time("window").alias("slide_time"), F.col("window.end").alias("slide_end"), "bid_auction",
                "bids")
    )
    maxima = (
        counts.groupBy(F.window("slide_time", f"{shape.max_window_ms} milliseconds"), "slide_end")
        .agg(F.max("bids").alias("max_bids"))
        .select(F.window_time("window").alias("max_time"), F.col("slide_end").alias("max_end"), "max_bids")
    )
    hottest = counts.join(maxima, F.expr("slide_end = max_end AND bids = max_bids AND slide_time = max_time"))
    return hottest.select(F.unix_millis("slide_end").alias("window_end_ms"), F.col("bid_auction").alias("auction"),
                          F.col("bids").alias("num"))


def _stop_between_batches(query: StreamingQuery, patience_s: float = 10.0) -> None:
    """Stop when no batch runs (the rate source's rows come once a second): a batch
    stopped midway aborts its write, which Spark logs as an error."""
    from pyspark.errors import StreamingQueryException

    deadline = time.monotonic() + patience_s
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        query.stop()
        query.awaitTermination()
    except StreamingQueryException:
        # Batches ran back to back past the patience: the stop interrupted one, which fails the query
        # (InterruptedException); the rows of the batches before it are in the sink, those measured.
        pass


def measure_latency(spark: SparkSession, shape: Q5Shape, rate: float, duration_s: float) -> dict:
    """Q5 on SSS at `rate` events/s for duration_s; latency = arrival at the sink - window end, per result row.

    A row's arrival is stamped in the JVM (System.currentTimeMillis, evaluated per
    row) as the last step before the memory sink's writer takes it: no Python
    callback on the peer's path. Latencies are those of rows arriving in the
    second half of the run, as ours.
    """
    events = spark.readStream.format("rate").option("rowsPerSecond", max(1, round(rate))).load()
    results = q5(nexmark_bids(events, shape), shape).withColumn(
        "arrived_ms", F.expr("reflect('java.lang.System', 'currentTimeMillis')").cast("long")
    )
    table = f"streamjobs_peer_q5_{uuid.uuid4().hex}"
    checkpoint = tempfile.mkdtemp(prefix="streamjobs-peer-q5-")
    query = (
        results.writeStream.outputMode("append").format("memory").queryName(table)
        .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start()
    )
    started_ms = time.time() * 1000
    progress: dict[int, dict] = {}  # by batch id: recentProgress keeps only the last 100
    try:
        while time.time() * 1000 < started_ms + duration_s * 1000:
            if query.exception() is not None:
                raise RuntimeError(f"peer query failed: {query.exception()}")
            progress.update((p["batchId"], p) for p in query.recentProgress)
            time.sleep(0.5)
        stopped_ms = time.time() * 1000
        progress.update((p["batchId"], p) for p in query.recentProgress)
    finally:
        _stop_between_batches(query)
        shutil.rmtree(checkpoint, ignore_errors=True)
    rows = spark.table(table).select("arrived_ms", "window_end_ms").toPandas()
    spark.catalog.dropTempView(table)
    arrived, ends = rows["arrived_ms"].to_numpy(np.float64), rows["window_end_ms"].to_numpy(np.float64)
    measured = (arrived >= (started_ms + stopped_ms) / 2) & (arrived <= stopped_ms)
    batches = [progress[batch_id] for batch_id in sorted(progress)]
    batch_ms = [p["durationMs"]["triggerExecution"] for p in batches]
    return {
        "latencies_ms": arrived[measured] - ends[measured],
        "rows": len(rows),
        "input_records_per_s": sum(p["numInputRows"] for p in batches) / ((stopped_ms - started_ms) / 1000),
        "batches": len(batches),
        "batch_p50_ms": float(np.median(batch_ms)) if batch_ms else None,
        "stateful_operators": len(batches[-1]["stateOperators"]) if batches else None,
    }


def measure_latencies(shape: Q5Shape, rates: list[float], duration_s: float, cores: int, warm_up_s: float) -> list[dict]:
    """measure_latency at each rate in turn on one local[cores] session, after a discarded warm-up run.

    Call it in a fresh process: a JVM's options are fixed when the first session in the
    process starts it. The warm-up pays the JVM's first streaming query (class loading,
    JIT), as our workers warm their sessions before a run's clock starts.
    """
    spark = session(cores)
    try:
        measure_latency(spark, shape, rates[0], warm_up_s)
        return [measure_latency(spark, shape, rate, duration_s) for rate in rates]
    finally:
        spark.stop()
