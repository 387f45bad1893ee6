"""Workers that die: an entry that kills its worker whenever it is processed is quarantined and the job goes on
exactly; a worker that dies whatever its input fails the job after `restarts.maxAttempts`, with the report
written and the cause named."""

from __future__ import annotations

import time

from rich.console import Console
from streamjobs.run import run_job
from streamjobs_core.deadletters import Kind, read_all
from streamjobs_core.exchange import RedisStreams
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import parse_job

RESTARTS = {"initialBackoffMs": 100, "maxBackoffMs": 400, "quarantineAfter": 2}


def test_an_entry_that_kills_its_worker_is_quarantined_and_the_rest_arrives_exactly(redis_server, r, tmp_path):
    job = parse_job({"metadata": {"name": "poisoned"}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "in", "type": "redis_stream", "partitions": 2, "schema": "n bigint, v string"}],
        "stages": [{"name": "checked", "type": "pyspark", "inputs": ["in"], "function": "tests.jobs.udfs:exit_on_poison"}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["checked"]}],
        "restarts": RESTARTS,
    }})
    keys = JobKeys("poisoned")
    ids = {}
    for n in range(120):
        ids[n] = r.xadd(keys.input_stream("in", n % 2), {"n": n, "v": "poison" if n == 40 else "ok"})
    # Stopped once the sink holds the rest; the duration only bounds a run that never gets there (each of the
    # restarts is a JVM start: seconds each on a loaded machine).
    report = run_job(job, 300, redis_url=redis_server.url, console=Console(force_terminal=False),
                     log_dir=str(tmp_path / "logs"), during=_until_out(r, keys, 119))
    assert report["drained"] and report["restarts"] >= 3  # quarantineAfter deaths, then two of the entry alone
    [letter] = read_all(RedisStreams(r), keys.dead_letter)
    assert (letter.kind, letter.entry_id, letter.stream) == (Kind.QUARANTINED, ids[40], keys.input_stream("in", 0))
    assert "a worker died processing this entry alone" in letter.error and '"poison"' in letter.record
    out = sorted(int(f[b"n"]) for _, f in r.xrange(keys.output_stream("out")))
    assert out == [n for n in range(120) if n != 40]
    assert report["verification"]["correct"] is True, report["verification"]


def _until_out(r, keys, records: int):
    """Keep the run until the sink holds `records` records (or its duration ends)."""
    def during(runtime, elapsed: float) -> None:
        if r.xlen(keys.output_stream("out")) >= records:
            runtime.jobs.request_stop()

    return during


def test_a_worker_that_dies_whatever_its_input_fails_the_job_naming_the_operator_and_cause(redis_server, r, tmp_path):
    job = parse_job({"metadata": {"name": "doomed"}, "spec": {
        "sources": [{"name": "words", "type": "zipf", "vocabulary": 50, "rate": {"recordsPerSecond": 200}}],
        "stages": [{"name": "dies", "type": "pyspark", "inputs": ["words"], "function": "tests.jobs.udfs:exit_always"}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["dies"]}],
        "restarts": {**RESTARTS, "maxAttempts": 2},
    }})
    started = time.monotonic()
    report = run_job(job, 120, redis_url=redis_server.url, console=Console(force_terminal=False),
                     log_dir=str(tmp_path / "logs"))
    assert time.monotonic() - started < 110  # ended by the failure, not by the duration
    failed = report["failed"]  # it dies in its start-up rehearsal: its own count of starts at one input tells
    assert failed["operator"] == "words" and "died 2 times in a row before committing anything" in failed["cause"]
    assert "words" in failed["input"]  # the generator partition it kept dying at
    assert (tmp_path / "logs" / "report.json").exists() and report["restarts"] == 2
