"""`streamjobs run --redis-url` of a job whose earlier run died goes on from its last commits; `streamjobs run
--from-savepoint`, from a savepoint's, in another Redis. The runs a savepoint is taken from are the CLI's, with
a process per worker; the restored runs, whose subject is what the savepoint carries and how it is split again,
run their workers as threads of this process (launchers.ThreadLauncher)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import redis
import yaml
from rich.console import Console
from streamjobs.launchers import ThreadLauncher
from streamjobs.redis_server import RedisServer
from streamjobs.run import run_job
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.resplit import in_flight
from streamjobs_core.savepoint import Savepoint

from .conftest import ROOT, assert_exact, grown, killer

pytestmark = pytest.mark.side


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
    second = _run(redis_server.url, "--duration", "5", "--report", str(report))
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
    next `streamjobs run --redis-url` goes on from there (at the parallelism the first run was rescaled to, which
    it says), and the output of both runs is exact."""
    r = redis.Redis.from_url(redis_server.url)
    jobs = RedisJobStore(r, "wordcount-small")
    first = _first_run(redis_server.url, r, jobs)
    rescale = subprocess.run([sys.executable, "-m", "streamjobs.cli", "rescale", "--job", "wordcount-small",
                              "--operator", "count", "--parallelism", "1", "--strategy", "batched", "--redis-url",
                              redis_server.url],
                             capture_output=True, text=True, timeout=180)
    assert rescale.returncode == 0, rescale.stderr
    stop = subprocess.run([sys.executable, "-m", "streamjobs.cli", "stop", "--job", "wordcount-small", "--redis-url",
                           redis_server.url], capture_output=True, text=True, timeout=180)
    assert stop.returncode == 0 and "stopped at its last commits" in stop.stdout, stop.stderr
    stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 0 and "suspended at its last commits" in stdout, stderr
    assert not jobs.registered() and not jobs.stop_requested()

    report = tmp_path / "r.json"
    second = _run(redis_server.url, "--duration", "5", "--report", str(report))
    stdout, stderr = second.communicate(timeout=240)
    assert second.returncode == 0 and "resumed wordcount-small from its last commits" in stdout, stderr
    # Its spec says 2 instances of count, the run it goes on from had 1: it says so and how to change it.
    assert "count goes on with parallelism 1, as it last ran; its spec says 2" in " ".join(stdout.split()), stdout
    verification = json.loads(report.read_text())["verification"]
    assert (verification["correct"], verification["lost"], verification["duplicated"]) == (True, 0, 0), verification
    assert not jobs.suspend_requested()
    jobs.clear(keep_input=False)


def test_a_savepoint_goes_on_in_another_redis_rescaled_with_a_window_reset_exactly_through_a_sigkill(
        redis_server, tmp_path):
    """Taken while the job runs, with windows open and records between its operators; restored into another
    redis-server under a spec with one more `count` instance and a longer window with one more aggregation. That
    window change is refused unless `count`'s state is reset (--reset-state): then each instance drops its windows
    at its switch, and `count/1` is SIGKILLed there after it. The output there begins with what the job had
    written at the savepoint; the oracle replays the records before each key group's reset under the old window,
    keeping the windows that fired before it, and those after it under the new one: all of it exact."""
    r = redis.Redis.from_url(redis_server.url)
    jobs = RedisJobStore(r, "wordcount-small")
    out = jobs.keys.output_stream("counts")
    doc = yaml.safe_load((ROOT / "tests/jobs/wordcount-small.yaml").read_text())
    count = doc["spec"]["stages"][0]
    count["parallelism"] = 3
    count["window"]["sizeMs"] = 3000
    count["aggregations"].append({"function": "max", "column": "event_time", "as": "last"})
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(doc))

    first = _first_run(redis_server.url, r, jobs)
    dry_runs = [subprocess.run([sys.executable, "-m", "streamjobs.cli", "reconfigure", "--job", "wordcount-small",
                                "-f", str(changed), "--redis-url", redis_server.url, "--dry-run", *reset],
                               capture_output=True, text=True, timeout=60)
                for reset in ([], ["--reset-state", "count"])]
    path = tmp_path / "wordcount.savepoint"
    taken = subprocess.run([sys.executable, "-m", "streamjobs.cli", "savepoint", "--job", "wordcount-small",
                            "--redis-url", redis_server.url, "--path", str(path)], capture_output=True, text=True,
                           timeout=60)
    assert taken.returncode == 0 and "running, copied between two commits" in taken.stdout, taken.stderr
    written = r.xrange(out, count=300)
    grown(r, out, 100)  # the first run goes on past the savepoint: none of that is in it
    first.send_signal(signal.SIGKILL)
    first.communicate()
    jobs.clear(keep_input=False)
    assert [c.returncode for c in dry_runs] == [2, 0], dry_runs
    assert "spec.stages[count].window: refused" in dry_runs[0].stdout
    assert "--reset-state count" in dry_runs[0].stdout
    assert "spec.stages[count]: live (--reset-state" in dry_runs[1].stdout
    assert "spec.stages[count].window: live" in dry_runs[1].stdout

    during = killer([(6, "count", 1)])
    with RedisServer() as other:
        report = run_job(parse_job(doc), 18, redis_url=other.url, console=Console(force_terminal=False),
                         log_dir=str(tmp_path / "logs"), during=during, launcher=ThreadLauncher(),
                         savepoint=Savepoint.read(path), reset=("count",))
        restored = RedisJobStore(redis.Redis.from_url(other.url), "wordcount-small")
        assert restored.r.xrange(out, count=300) == written
        [reconfigured] = report["reconfigurations"]
        assert set(restored.resets(reconfigured["version"], "count")) == set(range(12))
        sizes = Counter(int(fields[b"window_end"]) - int(fields[b"window_start"])
                        for _, fields in restored.r.xrange(out))
    assert sizes[2000] >= 300 and sizes[3000] > 100, sizes
    assert during.killed == ["count/1"] and report["restarts"] >= 1
    assert report["autoscaler"]["final_parallelism"]["count"] == 3
    assert [c["operator"] for c in report["rescales"]] == ["count"]
    assert_exact(report)


def test_a_savepoint_goes_on_under_another_max_parallelism_exactly_through_a_sigkill(redis_server, tmp_path):
    """Taken while the job runs, with windows open and records between its operators; restored into another
    redis-server under maxParallelism 20 (was 12): `count`'s windows and the records not read yet are split again
    by word over 20 key groups, and `count/1` is SIGKILLed after. The output of both runs is exact: no window lost
    a count or fired twice. Then `--drain-in-flight --stop` stops the first run with nothing in flight."""
    r = redis.Redis.from_url(redis_server.url)
    jobs = RedisJobStore(r, "wordcount-small")
    out = jobs.keys.output_stream("counts")
    first = _first_run(redis_server.url, r, jobs)
    path = tmp_path / "running.savepoint"
    taken = subprocess.run([sys.executable, "-m", "streamjobs.cli", "savepoint", "--job", "wordcount-small",
                            "--redis-url", redis_server.url, "--path", str(path)], capture_output=True, text=True,
                           timeout=60)
    assert taken.returncode == 0, taken.stderr
    savepoint = Savepoint.read(path)
    written = r.xrange(out, count=300)
    drained = subprocess.run([sys.executable, "-m", "streamjobs.cli", "savepoint", "--job", "wordcount-small",
                              "--redis-url", redis_server.url, "--path", str(tmp_path / "drained.savepoint"),
                              "--drain-in-flight", "--stop"], capture_output=True, text=True, timeout=180)
    assert drained.returncode == 0 and "drained: nothing in flight" in drained.stdout, drained.stderr
    stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 0 and "suspended at its last commits" in stdout, stderr
    assert in_flight(jobs, jobs.plan()) == []
    jobs.clear(keep_input=False)

    doc = yaml.safe_load((ROOT / "tests/jobs/wordcount-small.yaml").read_text())
    doc["spec"]["maxParallelism"] = 20
    during = killer([(6, "count", 1)])
    with RedisServer() as other:
        report = run_job(parse_job(doc), 15, redis_url=other.url, console=Console(force_terminal=False),
                         log_dir=str(tmp_path / "logs"), during=during, launcher=ThreadLauncher(),
                         savepoint=savepoint)
        restored = RedisJobStore(redis.Redis.from_url(other.url), "wordcount-small")
        plan = restored.plan()
        assert restored.r.xrange(out, count=300) == written
        assert plan.spec.max_parallelism == 20 and plan.version == savepoint.plan.version + 1
        assert restored.versions("count") == dict.fromkeys(range(20), plan.version)
        assert plan.key_groups("words") == 12  # the generator's partitions and offsets as they were
        assert any("spec.maxParallelism: 12 -> 20" in c for rec in restored.reconfigure_history() for c in rec.changes)
    assert during.killed == ["count/1"] and report["restarts"] >= 1
    assert_exact(report)
