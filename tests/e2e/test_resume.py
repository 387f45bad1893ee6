"""`streamjobs run --redis-url` of a job whose earlier run died goes on from its last commits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import redis
from streamjobs_core.jobstore import RedisJobStore

from .conftest import ROOT


def _run(redis_url: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamjobs.cli", "run", str(ROOT / "tests/jobs/wordcount-small.yaml"),
                             "--redis-url", redis_url, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def _first_run(redis_url: str, r, jobs) -> subprocess.Popen:
    """A fresh run of the job, once it has written 300 results."""
    jobs.clear(keep_input=False)
    first = _run(redis_url, "--fresh")
    deadline = time.monotonic() + 120
    while r.xlen(jobs.keys.output_stream("counts")) < 300:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.5)
    return first


def test_a_run_killed_with_its_workers_goes_on_exactly_and_a_drained_one_ends(redis_server, tmp_path):
    r = redis.Redis.from_url(redis_server.url)
    jobs = RedisJobStore(r, "wordcount-small")
    first = _first_run(redis_server.url, r, jobs)
    out = jobs.keys.output_stream("counts")
    first.send_signal(signal.SIGKILL)  # the runtime dies; its workers die with it (parent.py)
    first.communicate()
    t0, before = jobs.plan().t0_ms, r.xlen(out)

    report = tmp_path / "r.json"
    second = _run(redis_server.url, "--duration", "15", "--report", str(report))
    stdout, stderr = second.communicate(timeout=240)
    assert second.returncode == 0, stderr
    assert "resumed wordcount-small from its last commits" in stdout
    result = json.loads(report.read_text())
    verification = result["verification"]
    assert (verification["correct"], verification["lost"], verification["duplicated"]) == (True, 0, 0), verification
    assert jobs.plan().t0_ms == t0  # event time goes on from the first run's origin
    assert r.xlen(out) > before

    third = _run(redis_server.url, "--duration", "5")
    _, stderr = third.communicate(timeout=60)
    assert third.returncode == 2 and "was stopped and drained: it ended. --fresh starts it anew" in stderr
    jobs.clear(keep_input=False)


def test_a_job_stopped_without_draining_goes_on_from_its_last_commits_exactly(redis_server, tmp_path):
    """`streamjobs stop` (no --drain): every worker stops after its last commit, with windows still open; the
    next `streamjobs run --redis-url` goes on from there, and the output of both runs is exact."""
    r = redis.Redis.from_url(redis_server.url)
    jobs = RedisJobStore(r, "wordcount-small")
    first = _first_run(redis_server.url, r, jobs)
    stop = subprocess.run([sys.executable, "-m", "streamjobs.cli", "stop", "--job", "wordcount-small", "--redis-url",
                           redis_server.url], capture_output=True, text=True, timeout=180)
    assert stop.returncode == 0 and "stopped at its last commits" in stop.stdout, stop.stderr
    stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 0 and "suspended at its last commits" in stdout, stderr
    assert not jobs.registered() and not jobs.stop_requested()

    report = tmp_path / "r.json"
    second = _run(redis_server.url, "--duration", "15", "--report", str(report))
    stdout, stderr = second.communicate(timeout=240)
    assert second.returncode == 0 and "resumed wordcount-small from its last commits" in stdout, stderr
    verification = json.loads(report.read_text())["verification"]
    assert (verification["correct"], verification["lost"], verification["duplicated"]) == (True, 0, 0), verification
    assert not jobs.suspend_requested()
    jobs.clear(keep_input=False)
