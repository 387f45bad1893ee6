"""The benchmarks' pinning and CPU accounting (bench/cpus.py), against this machine's own /proc."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest
from streamjobs.bench import cpus


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_seconds_counts_every_thread_of_a_process_and_none_once_it_is_gone():
    before = cpus.cpu_seconds(os.getpid())
    worker = threading.Thread(target=_burn, args=(0.3,))
    worker.start()
    worker.join()
    assert cpus.cpu_seconds(os.getpid()) - before >= 0.25
    child = subprocess.Popen(["true"])
    child.wait()
    assert cpus.cpu_seconds(child.pid) is None


def test_the_family_holds_children_and_their_children():
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(found := cpus.family(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert found[0] == parent.pid and len(found) == 2
        assert set(found) <= set(cpus.family())
    finally:
        parent.kill()
        parent.wait()


def test_pinning_moves_processes_and_threads_started_before_it_and_lets_them_go_after():
    allowed = os.sched_getaffinity(0)
    early = subprocess.Popen(["sleep", "30"])
    waiting = threading.Event()
    seen: list[set[int]] = []
    thread = threading.Thread(target=lambda: (waiting.wait(), seen.append(os.sched_getaffinity(0))))
    thread.start()
    try:
        with cpus.pinned(1) as chosen:
            assert chosen == {min(allowed)}
            waiting.set()
            thread.join()
            late = subprocess.Popen(["sleep", "30"])
            assert os.sched_getaffinity(early.pid) == chosen == os.sched_getaffinity(late.pid) == seen[0]
        assert os.sched_getaffinity(early.pid) == allowed == os.sched_getaffinity(0)
        late.kill()
        late.wait()
    finally:
        early.kill()
        early.wait()


def test_more_cores_than_allowed_are_refused():
    with pytest.raises(ValueError, match="cores must be in"), cpus.pinned(len(os.sched_getaffinity(0)) + 1):
        pass


def _clock(times: list[float], cpu: list[float], progress: list[int]) -> cpus.CpuClock:
    clock = cpus.CpuClock()
    clock.times, clock.cpu, clock.progress = times, cpu, progress
    return clock


def test_a_stretch_reads_the_cpu_used_between_its_bounds_off_the_samples():
    clock = _clock([10.0, 11.0, 12.0], [1.0, 2.0, 4.0], [0, 0, 0])
    stretch = clock.stretch(10.5, 11.5, records=1_000_000)
    assert stretch.cpu_seconds == pytest.approx(1.5)  # 1.5 at 10.5 s, 3.0 at 11.5 s
    assert stretch.records_per_s == pytest.approx(1e6) and stretch.cpu_s_per_million == pytest.approx(1.5)
    assert clock.cpu_at(9.0) == 1.0 and clock.cpu_at(13.0) == 4.0
    with pytest.raises(ValueError, match="must end after"):
        clock.stretch(12.0, 11.0, 1)


def test_a_progress_stretch_leaves_out_the_first_quarter_and_ends_when_all_is_done():
    clock = _clock([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.5, 1.0, 2.0, 3.0, 3.1], [0, 10, 40, 70, 100, 100])
    stretch = clock.progress_stretch(100)
    assert (stretch.records, stretch.seconds, stretch.cpu_seconds) == (60, 2.0, 2.0)  # from 40 at 2 s to 100 at 4 s
    with pytest.raises(ValueError, match="never went"):
        clock.progress_stretch(200)


def test_spread_is_the_median_and_range_of_the_runs():
    assert cpus.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": [3.0, 1.0, 2.0]}
    assert cpus.spread([4.0, 1.0])["median"] == 2.5


def test_a_summary_gives_each_measure_over_the_runs_and_ratios_say_better_as_more_than_one():
    ours = cpus.summary([{"records_per_s": 300.0, "cpu_s_per_million": 2.0}, {"records_per_s": 100.0,
                                                                            "cpu_s_per_million": 4.0}])
    peer = cpus.summary([{"records_per_s": 400.0, "cpu_s_per_million": 1.5}])
    assert ours["records_per_s"]["median"] == 200.0 and len(ours["runs"]) == 2
    assert cpus.ratios(ours, peer) == {"rate": 0.5, "cpu": 0.5}  # half as fast, twice the CPU per record
    assert cpus.summary([{"records_per_s": 1.0, "cpu_s_per_million": 1.0}, {"error": "refused"}]) == {
        "error": "refused"}


def test_apart_runs_a_call_in_a_process_of_its_own():
    assert cpus.apart(os.getpid) != os.getpid()


def test_a_profile_says_which_process_used_the_cpu_of_a_stretch():
    # A second of CPU against the clock's own (counted as this process's): walking /proc every 10 ms outweighed a
    # 0.3 s burn on a loaded machine, where the burn took seconds of wall time.
    burn = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\ntime.sleep(60)\n"
    with cpus.CpuClock(interval_s=0.05, family_every_s=0.1) as clock:
        started = time.time()
        worker = subprocess.Popen(["python3", "-c", burn, "streamjobs_worker", "--operator", "count"])
        try:
            deadline = time.monotonic() + 50
            while (cpus.cpu_seconds(worker.pid) or 0) < 0.95 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.1)
        finally:
            ended = time.time()
            worker.kill()
            worker.wait()
    profile = clock.profile(started, ended)
    assert profile["worker count"] >= 0.8
    assert list(profile)[0] == "worker count"  # largest first
