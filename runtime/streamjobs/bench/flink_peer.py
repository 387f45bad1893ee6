"""Apache Flink as the benchmarks' second peer: the same queries in Flink SQL, on a local mini-cluster.

Each function starts a JVM pinned to `cores` cores (flink/session.py), runs one
or two jobs, stops it and removes its temp dir (logs included), and returns
snake_case keys prefixed `flink_`. Flink comes from the optional `bench` extra;
without it every function raises FlinkNotInstalled naming the install command.
The SQL, and what is measured from it, is in flink/sql.py.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ..live import percentiles
from .cpus import CpuClock
from .flink import nexmark_sql, sql
from .flink.session import FlinkNotInstalled, FlinkSession, flink_lib, installed

__all__ = ["FlinkNotInstalled", "installed", "measure_latency", "measure_query", "measure_restart", "measure_throughput"]

_START_TIMEOUT_S = 180  # a busy 2-core machine plans and deploys slowly
# The JVM's heap: datagen's sequence generator holds every value it will emit, boxed.
_BASE_HEAP_MB, _HEAP_BYTES_PER_RECORD = 1024, 64
# Savepoint bytes per key of the restart query's window state (measured: canonical savepoint, hashmap backend).
_SAVEPOINT_BYTES_PER_KEY = 100
# Datagen draws keys at random: 3 draws per key reach ~95% of them (1 - e^-3).
_DRAWS_PER_KEY = 3
_FILL_S = 10.0
_MIN_RESTART_ROWS_PER_S = 50_000
# Job 1's first window end is planned this far ahead (planning, mini-cluster start, deployment), plus
# the fill; when the job is not filled by then (a busy machine), a window 60 s later is taken ...
_RESTART_START_BUDGET_S = 20.0
_DEPLOY_S = 1.0  # from RUNNING to the sources' first rows
# ... and must close right after the stop begins: any restart then finds it due at once.
_WINDOW_END_AFTER_STOP_MS = 500


def measure_throughput(records: int, vocabulary: int = 1000, cores: int = 1) -> dict:
    """`bench throughput`'s keyed 1 s tumbling count in Flink SQL, parallelism 1, on `cores` cores.

    datagen (a sequence: row v is word 'w' || v % vocabulary at event time v / 200k s,
    as the SSS peer), watermark 200 ms behind, TUMBLE 1 s, COUNT(*) GROUP BY word and
    window, into a blackhole. `flink_records_per_s` is the steady rate: the event time
    between two window firings, as rows, over the wall time between them, from
    the 25% mark of the input to its end (sql.steady_rate). So it leaves out the
    job's start (planning, deployment, datagen filling its sequence), which
    `flink_records_per_s_with_start` (records over submit-to-finish wall time) keeps.
    `flink_cpu_s_per_million`: the CPU-seconds of the JVM (every thread) and of this
    process over the same stretch (cpus.CpuClock), per million records.
    """
    flink_lib()  # a missing extra fails here, before any work (in each function)
    job = sql.throughput_job(records, vocabulary)
    heap_mb = _BASE_HEAP_MB + records * _HEAP_BYTES_PER_RECORD // 1_000_000
    with FlinkSession(cores, heap_mb) as flink, CpuClock() as clock:
        submitted = time.time()
        client = flink.submit(job, parallelism=1)
        result = flink.result(client.getJobExecutionResult(), _START_TIMEOUT_S + records / 20_000)
        wall_s = time.time() - submitted
        job_s = result.getNetRuntime() / 1000
        rows = sql.print_rows(flink.lines())
    rate = sql.steady_rate(((sql.epoch_ms(end), sql.epoch_ms(fired)) for end, fired in rows), records)
    stretch = clock.stretch(rate.start_ms / 1000, rate.end_ms / 1000, rate.records)
    return {
        "flink_records_per_s": rate.records_per_s,
        "flink_cpu_s_per_million": stretch.cpu_s_per_million,
        "flink_cpu_by_process": clock.profile(stretch.start, stretch.end),
        "flink_measured_records": rate.records,
        "flink_measured_s": rate.seconds,
        "flink_records": records,
        "flink_job_s": job_s,
        "flink_records_per_s_with_start": records / wall_s,
        "flink_cores": cores,
        "flink_parallelism": 1,
    }


def measure_query(job: sql.FlinkJob, records: int, cores: int, parallelism: int = 1) -> dict:
    """A `bench nexmark` query (flink/nexmark_sql.query_job) over `records` events, on `cores` cores. Timed by its progress probe: from the first point at or past a quarter of the events (the start and
    JIT warm-up left out) to the last, with the CPU-seconds of the JVM and this process in between."""
    flink_lib()
    heap_mb = _BASE_HEAP_MB + records * _HEAP_BYTES_PER_RECORD // 1_000_000
    with FlinkSession(cores, heap_mb) as flink, CpuClock() as clock:
        client = flink.submit(job, parallelism)
        flink.result(client.getJobExecutionResult(), _START_TIMEOUT_S + records / 10_000)
        points = nexmark_sql.progress(sql.print_rows(flink.lines()))
    measured = [(seen, at) for seen, at in points if seen >= records / 4]
    if len(measured) < 2:
        raise RuntimeError(f"the progress probe printed {len(points)} points: too few to time {records} events")
    (first, start_ms), (last, end_ms) = measured[0], measured[-1]
    stretch = clock.stretch(start_ms / 1000, end_ms / 1000, last - first)
    return {**stretch.as_dict(), "cpu_by_process": clock.profile(stretch.start, stretch.end)}


def measure_latency(rate: float, duration_s: float, shape, parallelism: int = 1, cores: int = 2) -> dict:
    """NEXMark Q5 (sql.q5_job) at `rate` events/s for `duration_s` s; latency of each result row.

    A result's latency is the wall time its row reached the sink minus its window
    end, event time being the wall time an event was generated (minus its
    disorder). Flink's defaults otherwise: watermarks emitted every 200 ms. As in
    our runs, only results whose window ends in the second half of the run (from
    RUNNING on) count: the first pays deployment and JIT warm-up. Q5 gives one
    result per slide (1 s), hence few samples: `flink_samples` says how many.
    `shape` is sss_peer.Q5Shape, the one latency.py reads from our job.
    """
    flink_lib()
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    events = math.ceil(rate * (duration_s + _START_TIMEOUT_S + 60))  # more than the run takes: it is cancelled
    job = sql.q5_job(shape, rate, t0_s=int(time.time()) - 60, rows=events)  # from t0 on, auction ids are taken
    with FlinkSession(cores) as flink:
        client = flink.submit(job, parallelism)
        running = flink.wait_status(client, "RUNNING", _START_TIMEOUT_S)
        time.sleep(duration_s)
        flink.result(client.cancel(), 60)
        rows = sql.print_rows(flink.lines())
    latencies = np.asarray(sql.q5_latencies_ms(rows, round((running + duration_s / 2) * 1000)), dtype=np.float64)
    spread = percentiles(latencies)
    return {
        "flink_p50_ms": spread["p50_ms"],
        "flink_p99_ms": spread["p99_ms"],
        "flink_samples": len(latencies),
        "flink_results": len(rows),
        "flink_parallelism": parallelism,
        "flink_cores": cores,
    }


def measure_restart(state_mb: float, from_parallelism: int, to_parallelism: int, cores: int = 2) -> dict:
    """Flink's own rescale: stop with a savepoint, restart from it at the new parallelism, until the first output.

    The query (sql.restart_job) is a keyed 60 s tumbling count over enough keys
    for a savepoint of ~`state_mb` MB; event time is the generation's wall time.
    Job 1 runs at `from_parallelism` until its open window holds them all, and is
    stopped with a savepoint 0.5 s before that window ends, so the window is due
    the moment the restored job reads its first rows: its first output marks the
    end of the pause. Job 2 restores at `to_parallelism`. Times (wall clock, ms):
    `flink_stop_with_savepoint_ms` from the stop request to the savepoint's path;
    `flink_restart_to_running_ms` from there to job 2 RUNNING (planning and the
    mini-cluster's start included); `flink_restart_pause_ms` from the stop request
    to job 2's first output row. Both jobs run on `cores` cores.
    """
    flink_lib()
    if state_mb <= 0 or from_parallelism < 1 or to_parallelism < 1:
        raise ValueError(f"state_mb ({state_mb}) must be > 0 and parallelisms ({from_parallelism}, "
                         f"{to_parallelism}) >= 1")
    keys = math.ceil(state_mb * 1e6 / _SAVEPOINT_BYTES_PER_KEY)
    rows_per_s = max(_MIN_RESTART_ROWS_PER_S, math.ceil(keys * _DRAWS_PER_KEY / _FILL_S))
    fill_s = keys * _DRAWS_PER_KEY / rows_per_s
    settings = {"pipeline.max-parallelism": "128"}  # the key groups both parallelisms split
    with FlinkSession(cores) as flink:
        savepoints = flink.dir / "savepoints"
        # Both jobs plan the same SQL (so the restored operators match): its windows are fixed up front.
        planned_end_ms = math.ceil((time.time() + _RESTART_START_BUDGET_S + fill_s) * 1000)
        job = sql.restart_job(keys, rows_per_s, planned_end_ms)
        first = flink.submit(job, from_parallelism, settings)
        started = flink.wait_status(first, "RUNNING", _START_TIMEOUT_S)
        # The first window end that leaves time to deploy and then fill its window before the stop.
        filled_ms = (started + _DEPLOY_S + fill_s) * 1000 + _WINDOW_END_AFTER_STOP_MS
        fire_at_ms = sql.next_window_end_ms(planned_end_ms, math.ceil(filled_ms))
        time.sleep(max(0.0, fire_at_ms / 1000 - _WINDOW_END_AFTER_STOP_MS / 1000 - time.time()))
        stop_requested = time.time()
        savepoint = flink.result(first.stopWithSavepoint(False, f"file://{savepoints}", _canonical(flink)), 600)
        stopped = time.time()
        second = flink.submit(job, to_parallelism, {**settings, "execution.savepoint.path": savepoint})
        running = flink.wait_status(second, "RUNNING", _START_TIMEOUT_S)
        first_output = _wait_for_output(flink, fire_at_ms, _START_TIMEOUT_S)
        if first_output < stopped * 1000:  # job 1's
            raise RuntimeError("the window fired before the savepoint was taken: the stop took over "
                               f"{_WINDOW_END_AFTER_STOP_MS} ms to reach the sources")
        flink.result(second.cancel(), 60)
        savepoint_bytes = _bytes_under(Path(savepoint.removeprefix("file:")))
    return {
        "flink_restart_pause_ms": first_output - stop_requested * 1000,
        "flink_stop_with_savepoint_ms": (stopped - stop_requested) * 1000,
        "flink_restart_to_running_ms": (running - stopped) * 1000,
        "flink_restart_to_first_output_ms": first_output - stopped * 1000,
        "flink_savepoint_bytes": savepoint_bytes,
        "flink_state_keys": keys,
        "flink_rows_per_s": rows_per_s,
        "flink_window_end_after_stop_ms": fire_at_ms - stop_requested * 1000,
        "flink_from_parallelism": from_parallelism,
        "flink_to_parallelism": to_parallelism,
        "flink_cores": cores,
    }


def _canonical(flink: FlinkSession):
    # Flink's default format for savepoints, which any state backend restores.
    return flink.jvm.org.apache.flink.core.execution.SavepointFormatType.CANONICAL


def _wait_for_output(flink: FlinkSession, window_end_ms: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    rows: list[list[str]] = []
    while (first := sql.first_output_ms(rows, window_end_ms)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no output from the restored job within {timeout_s:.0f} s{flink.log_errors()}")
        time.sleep(0.05)
        rows.extend(sql.print_rows(flink.lines()))
    return first


def _bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
