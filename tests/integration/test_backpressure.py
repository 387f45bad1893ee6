"""A producer pauses while its output edge holds more unconsumed records than the bound.

Then a source is offered 4x the capacity of a slow stage downstream, the three workers run side by side
(a thread each, as each is a process of its own when deployed), and what the edges and Redis hold
meanwhile is measured against bounds derived from the spec and from entry sizes measured beforehand.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import msgpack
import numpy as np
import pytest
import redis
from streamjobs_core import generators
from streamjobs_core.codec import encode
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_worker.ports import Ports
from streamjobs_worker.sources import with_ingest_time
from streamjobs_worker.worker import Worker


def test_source_stops_producing_over_the_lag_bound(r):
    bound = 5_000
    job = parse_job({
        "metadata": {"name": "bp"},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "rate": {"recordsPerSecond": 50_000}}],
            "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["words"], "chain": False}],  # an edge
            "batching": {"maxLagRecords": bound},
        },
    })
    plan = JobPlan(job, int(time.time() * 1000))
    RedisJobStore(r, plan.name).deploy(plan)
    source = Worker(Ports.over_redis(r, plan.id), plan, "words", 0)
    source.restore()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # nobody consumes: the edge only fills
        source.step()
    produced = sum(int(v) for v in r.hvals(plan.keys.produced("words", "out")))
    offered = 50_000 * (time.time() - plan.t0_ms / 1000)
    assert bound < produced <= bound + 50_000 * 0.25, "at most the batches of one check interval past the bound"
    assert produced < offered / 4
    paused = source.metrics.registry.get_sample_value(
        "streamjobs_backpressured_seconds_total", {"job": "bp", "operator": "words", "instance": "0"}
    )
    assert paused > 1.0


def test_a_stage_runs_what_it_holds_at_once_when_its_producer_waits_for_it(r, spark):
    # Hour-long windows and minIntervalMs of a minute: by pacing alone the stage would wait a minute for a
    # fuller batch, while its source, over the lag bound, waits for it to consume: both idle.
    bound = 5_000
    job = parse_job({
        "metadata": {"name": "held"},
        "spec": {
            "sources": [{"name": "words", "type": "zipf", "rate": {"recordsPerSecond": 1e9}}],  # always behind
            "stages": [{"name": "count", "type": "window_aggregate", "inputs": ["words"], "keyBy": "word",
                        "window": {"sizeMs": 3_600_000}, "aggregations": [{"function": "count", "as": "n"}]}],
            "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["count"]}],
            "batching": {"maxLagRecords": bound, "minIntervalMs": 60_000},
        },
    })
    plan = JobPlan(job, int(time.time() * 1000))
    RedisJobStore(r, plan.name).deploy(plan)
    ports = Ports.over_redis(r, plan.id)
    source, stage = Worker(ports, plan, "words", 0), Worker(ports, plan, "count", 0)
    source.restore()
    stage.restore()

    def produced() -> int:
        return sum(int(v) for v in r.hvals(plan.keys.produced("words", "count")))

    def consumed() -> int:
        return sum(int(v) for v in r.hvals(plan.keys.consumed("words", "count")))

    deadline = time.monotonic() + 20
    while True:  # side by side, as their processes run
        assert time.monotonic() < deadline, "the source never reached the lag bound"
        source.step()
        if produced() - consumed() > bound:
            break
        stage.step()
    held = produced()  # the source now pauses until the stage commits
    started = time.monotonic()
    while consumed() < held and time.monotonic() - started < 10:
        stage.step()
    assert consumed() == held, f"the stage consumed {consumed()} of the {held} records its source waits on"


# --- input at 4x a slow stage's capacity ---------------------------------------------------------

COST_US = 1_000  # the stage sleeps 1 ms per record: at most 1,000 records/s, less Spark's cost per batch
RATE = 4_000  # offered records/s: 4x that ceiling
MAX_LAG = 1_000  # batching.maxLagRecords
MAX_RECORDS = 250  # batching.maxRecords: the largest batch a source writes at once
RUN_S = 8
EDGES = ("words>slow", "slow>out")

# Records an edge holds at most, as the worker is designed (worker.py `_backpressured`): a producer pauses
# while an output edge holds more than maxLagRecords, so past the bound it adds the batch it was writing:
#   words>slow: MAX_LAG + MAX_RECORDS             a source batch holds at most maxRecords
#   slow>out:   MAX_LAG + one stage batch         a stage batch holds at most what words>slow holds
EDGE_BOUND = {"words>slow": MAX_LAG + MAX_RECORDS}
EDGE_BOUND["slow>out"] = MAX_LAG + EDGE_BOUND["words>slow"]
SMALLEST_ENTRY = 100  # records: a source entry holds RATE x 50 ms (a tick) or MAX_RECORDS (behind)
LATENCY_SAMPLES = 200  # the sink writes one entry of at most this many latency samples per batch (worker.py)
# The job's hashes (assignments, offsets, watermarks, produced/consumed counters: < 4 KiB with one key
# group) and the query and reply buffers of the four connections beyond their idle size (<= 32 KiB each).
HASHES_AND_BUFFERS = 128 * 1024


@dataclass
class Run:
    baseline: int  # used_memory before the job wrote anything, its clients connected
    peak: int  # the largest used_memory sampled while the job ran
    samples: int
    max_lag: dict[str, int]  # the largest produced - consumed sampled per edge
    bytes_per_record: float  # measured: a stored kg stream entry of SMALLEST_ENTRY records, per record
    bytes_per_latency: float  # measured: a stored entry of LATENCY_SAMPLES latency samples
    bytes_per_command: int  # measured: Redis 7's latency histogram of a command type, made at its first call
    new_commands: int  # command types first called after the baseline
    sink_batches: int
    offered: int
    produced: int  # into words>slow
    consumed: int  # from words>slow, by the slow stage
    delivered: int  # records the sink committed
    paused_s: float  # the source's streamjobs_backpressured_seconds_total
    duration_s: float
    errors: list[BaseException]

    @property
    def allowances(self) -> dict[str, int]:
        """What Redis may hold beyond the baseline, in bytes, derived from the bounds above."""
        stored = sum(EDGE_BOUND.values())
        return {
            "kg streams": int(stored * self.bytes_per_record),
            # A commit's MULTI queues a copy of its batch: the source's (<= MAX_RECORDS records) and the
            # stage's (<= what words>slow held); the Parquet sink's queues one manifest path.
            "queued commits": int((MAX_RECORDS + EDGE_BOUND["words>slow"]) * self.bytes_per_record),
            "XREAD replies": int(stored * self.bytes_per_record),  # stage and sink read at most their edge
            "latency samples and manifest": int(self.sink_batches * (self.bytes_per_latency + 256)),
            "command latency histograms": self.new_commands * self.bytes_per_command,
            "hashes and buffers": HASHES_AND_BUFFERS,
        }

    @property
    def bound(self) -> int:
        return self.baseline + sum(self.allowances.values())

    def __str__(self) -> str:
        return (
            f"used_memory peaked {self.peak - self.baseline:,} B over the baseline ({self.samples} samples), "
            f"bound {self.bound - self.baseline:,} B = {self.allowances} at {self.bytes_per_record:.1f} B/record; "
            f"largest lag per edge {self.max_lag}, bound {EDGE_BOUND}; offered {self.offered:,} records, "
            f"produced {self.produced:,}, stage consumed {self.consumed:,}, sink wrote {self.delivered:,}; "
            f"source paused {self.paused_s:.1f} s of {self.duration_s:.1f} s"
        )


def _stored_bytes(r: redis.Redis, fields: dict, entries: int) -> float:
    """Memory one stream entry with these fields takes in this redis-server (mean over many)."""
    before = r.info("memory")["used_memory"]
    pipe = r.pipeline(transaction=False)
    for _ in range(entries):
        pipe.xadd("scratch", fields)
    pipe.execute()
    grown = r.info("memory")["used_memory"] - before
    r.delete("scratch")
    return grown / entries


def _latency_histogram_bytes(r: redis.Redis) -> int:
    """Redis 7 keeps a latency histogram per command type, made at its first call and never freed."""
    for command in ("LASTSAVE", "TIME", "DBSIZE", "RANDOMKEY"):  # harmless ones, some perhaps not called yet
        before = r.info("memory")["used_memory"]
        r.execute_command(command)
        grown = r.info("memory")["used_memory"] - before
        if grown:
            return grown
    return 0  # all called before, or a redis-server without latency tracking (6.x)


@pytest.fixture(scope="module")
def slow_stage_run(redis_server, spark, tmp_path_factory) -> Run:
    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    job = parse_job({
        "metadata": {"name": "bp4x"},
        "spec": {
            "maxParallelism": 1,
            "sources": [{"name": "words", "type": "zipf", "rate": {"recordsPerSecond": RATE}}],
            # Not chained: three workers and two edges whose bounds are under test.
            "stages": [{"name": "slow", "type": "sql", "inputs": ["words"], "simulatedCostUs": COST_US, "chain": False,
                        "query": "SELECT word, event_time, _ingest_ms FROM input"}],
            # Parquet: the sink's rows leave Redis, which then holds only the kg streams and bookkeeping.
            "sinks": [{"name": "out", "type": "parquet", "inputs": ["slow"],
                       "path": str(tmp_path_factory.mktemp("bp4x"))}],
            "batching": {"maxLagRecords": MAX_LAG, "maxRecords": MAX_RECORDS},
        },
    })
    now_ms = int(time.time() * 1000)
    sample = generators.generate(job.spec.operator("words"), now_ms, np.arange(SMALLEST_ENTRY))
    entry = encode(with_ingest_time(sample, now_ms), now_ms, [(0, 0)])
    per_record = _stored_bytes(r, entry, 200) / SMALLEST_ENTRY
    per_latency = _stored_bytes(r, {"t": now_ms, "l": msgpack.packb([100_000] * LATENCY_SAMPLES)}, 200)
    per_command = _latency_histogram_bytes(r)

    # One client per worker, as each worker process has its own; connected before the baseline.
    clients = {op: redis.Redis.from_url(redis_server.url) for op in ("words", "slow", "out")}
    for client in clients.values():
        client.ping()
    commands_before = set(r.info("commandstats"))
    baseline = r.info("memory")["used_memory"]

    plan = JobPlan(job, int(time.time() * 1000))
    RedisJobStore(r, plan.name).deploy(plan)
    workers = {op: Worker(Ports.over_redis(clients[op], plan.id), plan, op, 0) for op in clients}
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(worker: Worker) -> None:  # each worker in its own thread, as each runs in its own process
        try:
            worker.run(stop)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in workers.values()]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    peak, samples, max_lag = 0, 0, dict.fromkeys(EDGES, 0)
    while time.monotonic() - started < RUN_S and not stop.is_set():
        pipe = r.pipeline(transaction=True)  # memory and counters at one instant
        pipe.info("memory")
        for edge in EDGES:
            up, down = edge.split(">")
            pipe.hvals(plan.keys.produced(up, down))
            pipe.hvals(plan.keys.consumed(up, down))
        info, *counters = pipe.execute()
        peak, samples = max(peak, info["used_memory"]), samples + 1
        for i, edge in enumerate(EDGES):
            lag = sum(map(int, counters[2 * i])) - sum(map(int, counters[2 * i + 1]))
            max_lag[edge] = max(max_lag[edge], lag)
        time.sleep(0.01)
    offered = generators.due_count(job.spec.operator("words"), time.time() - plan.t0_ms / 1000)
    stop.set()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a worker did not stop"
    new_commands = len(set(r.info("commandstats")) - commands_before)

    def metric(op: str, name: str) -> float:
        labels = {"job": "bp4x", "operator": op, "instance": "0"}
        return workers[op].metrics.registry.get_sample_value(name, labels) or 0.0

    def total(key: str) -> int:
        return sum(int(v) for v in r.hvals(key))

    result = Run(
        baseline=baseline, peak=peak, samples=samples, max_lag=max_lag, bytes_per_record=per_record,
        bytes_per_latency=per_latency, bytes_per_command=per_command, new_commands=new_commands,
        sink_batches=int(metric("out", "streamjobs_batches_total")), offered=offered,
        produced=total(plan.keys.produced("words", "slow")),
        consumed=total(plan.keys.consumed("words", "slow")),
        delivered=int(metric("out", "streamjobs_records_in_total")),
        paused_s=metric("words", "streamjobs_backpressured_seconds_total"),
        duration_s=time.monotonic() - started, errors=errors,
    )
    print(result)
    for client in clients.values():
        client.close()
    r.close()
    return result


def test_at_4x_a_stages_capacity_the_source_pauses_and_the_stage_keeps_consuming(slow_stage_run):
    run = slow_stage_run
    assert not run.errors, run.errors
    assert run.paused_s > 2.0, run
    # The stage consumed and the sink wrote: it is the bound, not a stall, that holds the source back.
    assert run.consumed >= 1_000 and run.delivered >= 500, run
    # The stage takes at most 1,000 records/s; without backpressure the source emits all it is offered.
    assert run.produced < run.offered / 2, f"offered {run.offered:,} records, produced {run.produced:,}"


def test_at_4x_a_stages_capacity_each_edge_and_redis_memory_stay_under_the_derived_bound(slow_stage_run):
    run = slow_stage_run
    assert all(run.max_lag[edge] <= EDGE_BOUND[edge] for edge in EDGES), run
    assert run.peak <= run.bound, run
