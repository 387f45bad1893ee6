"""`streamjobs bench throughput`: a keyed 1 s tumbling count at saturation, ours against Apache Flink and
Spark Structured Streaming, on the same cores, sources included on every side.

For each core count (1, then 2) every process of every system runs on the same
cores (cpus.pinned: ours are the source and the count worker processes, their
JVMs, the runtime's controller and redis-server; Flink's is its JVM; Spark's is
its driver process and JVM), one system at a time, `runs` times each:
- ours: the job below run by the local runtime, its zipf source generating as
  fast as backpressure lets it, checked exact by the oracle afterwards;
- Flink: the same query in Flink SQL over its datagen source, parallelism 1
  (flink_peer.measure_throughput);
- Spark Structured Streaming: the same query on its rate-micro-batch source,
  `local[cores]`, in a process of its own (sss_peer.measure_peer).
Each is measured over a stretch that leaves out its start (JVMs, planning, JIT):
ours from the sample that saw 25% of the input consumed by the count stage to
the one that saw all of it, Flink between window firings from 25% of its input
on, Spark over its batches after two. Over that stretch: records/s of wall time
and CPU-seconds per million records, summed over every process of that system
from /proc (cpus.CpuClock). Reported per system: median and range of the runs;
ratios are of medians, >= 1 when ours is better (faster, or less CPU).
The three sources differ (ours draws zipf words by hashing the record index,
Flink and Spark take a sequence modulo the vocabulary); each is part of its system.
"""

from __future__ import annotations

from streamjobs_core.loading import parse_job
from streamjobs_core.spec import StreamJob

from . import ours, sss_peer
from .cpus import CpuClock, apart, pinned, ratios, summary

VOCABULARY = 1000
SOURCE, STAGE = "words", "count"
MAX_BATCH_RECORDS = 200_000


def count_job(records: int, max_batch_records: int = MAX_BATCH_RECORDS) -> StreamJob:
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "bench-throughput"},
        "spec": {
            "sources": [{"name": SOURCE, "type": "zipf", "vocabulary": VOCABULARY, "totalRecords": records,
                         "rate": {"recordsPerSecond": 1e9}}],
            "stages": [{"name": STAGE, "type": "window_aggregate", "inputs": [SOURCE], "keyBy": "word",
                        "window": {"sizeMs": 1000}, "aggregations": [{"function": "count", "as": "n"}]}],
            "sinks": [{"name": "out", "type": "redis_stream", "inputs": [STAGE]}],
            "batching": {"maxRecords": max_batch_records},
        },
    })


def measure_ours(records: int, launcher=None, max_batch_records: int = MAX_BATCH_RECORDS) -> dict:
    """The whole job, source included, timed by the records its count stage consumed; checked by the oracle."""
    job = count_job(records, max_batch_records)
    key_groups = range(job.spec.max_parallelism)
    return ours.measure(job, records, lambda jobs: sum(jobs.consumed([SOURCE], STAGE, key_groups).values()),
                        launcher)


def measure_sss(cores: int, batches: int) -> dict:
    # A process of its own, started while pinned: its JVM is configured by the peer alone, on the same cores.
    with CpuClock() as clock:
        peer = apart(_sss, cores, batches)
    stretch = clock.stretch(peer["start_s"], peer["end_s"], peer["records"])
    return {**stretch.as_dict(), "cpu_by_process": clock.profile(stretch.start, stretch.end)}


def _sss(cores: int, batches: int) -> dict:
    spark = sss_peer.session(cores)
    try:
        return sss_peer.measure_peer(spark, rows_per_batch=200_000, batches=batches, vocabulary=VOCABULARY)
    finally:
        spark.stop()


def _flink(records: int, cores: int) -> dict:
    from . import flink_peer

    measured = flink_peer.measure_throughput(records, VOCABULARY, cores)
    return {"records_per_s": measured["flink_records_per_s"], "cpu_s_per_million": measured["flink_cpu_s_per_million"],
            "records": measured["flink_measured_records"], "seconds": measured["flink_measured_s"],
            "cpu_by_process": measured["flink_cpu_by_process"]}


def at_cores(cores: int, runs: int, quick: bool, with_flink: bool) -> dict:
    records = 10_000_000 if quick else 30_000_000  # a stretch of seconds: a shorter one swings with JIT and GC
    flink_records = 10_000_000 if quick else 30_000_000
    systems: dict[str, list[dict]] = {"ours": [], "flink": [], "sss": []}
    with pinned(cores) as chosen:
        for _ in range(runs):  # interleaved: a drift of the machine over the runs touches every system alike
            systems["ours"].append(measure_ours(records))
            if with_flink:
                systems["flink"].append(_flink(flink_records, cores))
            systems["sss"].append(measure_sss(cores, batches=8 if quick else 24))
    result = {"cpus": sorted(chosen), "records": records, "flink_records": flink_records}
    for name, measured in systems.items():
        if measured:
            result[name] = summary(measured)
    result["sss_ratio"] = ratios(result["ours"], result["sss"])
    if with_flink:
        result["flink_ratio"] = ratios(result["ours"], result["flink"])
    result["exact"] = all(run["correct"] is True for run in systems["ours"])
    return result


def run(quick: bool, runs: int = 3, cores: tuple[int, ...] = (1, 2)) -> dict:
    from .latency import FLINK_MISSING, flink_peer

    with_flink = flink_peer() is not None
    result: dict = {"sources": "included on every side", "runs": runs, "vocabulary": VOCABULARY,
                    "batch_max_records": MAX_BATCH_RECORDS}
    if not with_flink:
        result["flink"] = FLINK_MISSING
    result["by_cores"] = {str(n): at_cores(n, runs, quick, with_flink) for n in cores}
    return result
