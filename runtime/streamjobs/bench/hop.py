"""`streamjobs bench hop`: where one micro-batch's time goes, per stage type and batch size.

For each stage type (sql, pyspark, window_aggregate, stateful, and a Redis sink
with no stage) and each size (100, 10k and 100k records) a real worker, in this
process on a one-core SparkSession, runs one batch of its normal loop over
input that a router wrote into its kg streams, phase by phase (phases.py):
read (XREAD), decode (Arrow IPC), to_jvm (createDataFrame), plan (parse,
analyse, optimise, physical plan), execute (run the job and bring its result
back as Arrow), state (merge and fire, or state in and out), encode (route
the output or write the sink) and commit (one MULTI/EXEC). `other_ms` is what
no phase covers (the loop's own bookkeeping, metrics).

Beside it, the same run's bare-Spark floor: the stage's query alone on the same
input already cached in the JVM, written to Spark's noop sink (no transfer in
or out). What a hop costs above that floor is the bridge and the Python side.
Medians over `repeats` batches after one warm-up batch per cell.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pyarrow as pa
import redis
from streamjobs_core import generators
from streamjobs_core.exchange import Transaction
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.keygroups import runs
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_worker import phases
from streamjobs_worker.outputs import OutputRouter
from streamjobs_worker.ports import Ports
from streamjobs_worker.sources import with_ingest_time
from streamjobs_worker.stages.window import partial_sql
from streamjobs_worker.worker import Worker

from ..redis_server import RedisServer

SIZES = (100, 10_000, 100_000)
VOCABULARY = 1000
STAGE = "hop"
_SQL = "SELECT word, length(word) AS letters, event_time, _ingest_ms FROM input WHERE event_time >= 0"

STAGES: dict[str, dict] = {
    "sql": {"type": "sql", "query": _SQL},
    "pyspark": {"type": "pyspark", "function": "streamjobs.bench.functions:letters"},
    "window_aggregate": {"type": "window_aggregate", "keyBy": "word", "window": {"sizeMs": 1000},
                         "aggregations": [{"function": "count", "as": "n"}]},
    "stateful": {"type": "stateful", "keyBy": "word", "function": "streamjobs.bench.functions:running_count",
                 "stateSchema": "seen long"},
}
KINDS = (*STAGES, "sink")


def _job(kind: str) -> JobPlan:
    source = {"name": "words", "type": "zipf", "vocabulary": VOCABULARY}
    if kind == "sink":
        stages, sink_input = [], "words"
    else:
        stages, sink_input = [{"name": STAGE, "inputs": ["words"], "chain": False, **STAGES[kind]}], STAGE
    job = parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": f"hop-{kind.replace('_', '-')}"},
        "spec": {"sources": [source], "stages": stages,
                 "sinks": [{"name": "out", "type": "redis_stream", "inputs": [sink_input], "chain": False}],
                 # Every batch runs as soon as it is read: the hop's own cost, without pacing.
                 "batching": {"maxRecords": 1_000_000, "minIntervalMs": 0}},
    })
    return JobPlan(job, 0)


def _input(plan: JobPlan, records: int, batch: int) -> pa.Table:
    """The batch's records: event times inside one second of event time per batch, so each batch's watermark
    passes a window end (a window stage merges and fires, as it does in steady state)."""
    spec = plan.spec.operator("words")
    table = generators.generate(spec, 0, np.arange(batch * records, (batch + 1) * records, dtype=np.int64))
    times = pa.array(batch * 1000 + np.arange(records, dtype=np.int64) * 1000 // max(1, records))
    table = table.set_column(table.schema.get_field_index("event_time"), "event_time", times)
    return with_ingest_time(table, int(time.time() * 1000))


def _prefill(r: redis.Redis, plan: JobPlan, table: pa.Table, watermark: int) -> None:
    """The batch routed into the consumer's kg streams, as the source would write it."""
    router = OutputRouter(plan, "words", runs(range(plan.key_groups("words"))))
    txn = Transaction()
    router.route(table, watermark, txn)
    pipe = r.pipeline(transaction=True)
    for key, fields, _ in txn.xadds:
        pipe.xadd(key, fields)
    for key, field, amount in txn.hincrs:
        pipe.hincrby(key, field, amount)
    pipe.execute()


def _floor(spark, kind: str, plan: JobPlan, table: pa.Table, repeats: int) -> float | None:
    """The stage's query alone on input already in the JVM, to Spark's noop sink: milliseconds, median."""
    if kind == "sink":
        return None
    df = spark.createDataFrame(table).coalesce(1).cache()
    df.count()
    df.createOrReplaceTempView("input")
    spec = plan.spec.operator(STAGE)

    def once() -> None:
        if kind == "sql":
            frames = [spark.sql(spec.query)]
        elif kind == "window_aggregate":
            frames = [spark.sql(partial_sql(spec))]
        else:
            from streamjobs_worker.stages.base import load_function

            function = load_function(spec.function)
            if kind == "pyspark":
                frames = [function(df)]
            else:
                state = spark.createDataFrame([], f"word string, {spec.state_schema}")
                frames = list(function(df, state))
        for frame in frames:
            frame.write.format("noop").mode("overwrite").save()

    once()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        once()
        times.append(time.perf_counter() - started)
    df.unpersist()
    return statistics.median(times) * 1000


def measure(r: redis.Redis, spark, kind: str, records: int, repeats: int) -> dict:
    r.flushall()
    plan = _job(kind)
    RedisJobStore(r, plan.id).deploy(plan)
    consumer = plan.spec.consumers("words")[0].name
    worker = Worker(Ports.over_redis(r, plan.id), plan, consumer, 0)
    worker.restore()
    rows: list[dict] = []
    for batch in range(repeats + 1):
        table = _input(plan, records, batch)
        _prefill(r, plan, table, watermark=(batch + 1) * 1000)
        while True:  # one step reads the whole batch and runs it
            with phases.Recording() as recording:
                started = time.perf_counter()
                worker.step()
                total = time.perf_counter() - started
            if sum(int(v) for v in r.hvals(plan.keys.consumed("words", consumer))) >= (batch + 1) * records:
                break
        if batch:  # the first batch compiles the query and warms the JIT
            rows.append({"total": total, **recording.seconds})
    floor = _floor(spark, kind, plan, _input(plan, records, repeats + 1), repeats)
    phases_ms = {p: statistics.median(row.get(p, 0.0) for row in rows) * 1000 for p in phases.PHASES}
    total_ms = statistics.median(row["total"] for row in rows) * 1000
    return {
        "records": records,
        "total_ms": total_ms,
        "phases_ms": phases_ms,
        "other_ms": max(0.0, total_ms - sum(phases_ms.values())),
        "spark_floor_ms": floor,
        "over_floor": total_ms / floor if floor else None,
        "records_per_s": records / (total_ms / 1000),
    }


def run(quick: bool, sizes: tuple[int, ...] = SIZES) -> dict:
    from streamjobs_worker import spark as worker_spark

    repeats = 3 if quick else 7
    spark = worker_spark.session("local[1]", "2g")
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        stages = {kind: {str(n): measure(r, spark, kind, n, repeats) for n in sizes} for kind in KINDS}
    return {"cores": 1, "repeats": repeats, "sizes": list(sizes), "phases": list(phases.PHASES), "stages": stages}
