"""Rescaling a running job: the other operators keep going, the result stays exact."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import redis
from streamjobs_core.control import Phase, RescaleRecord
from streamjobs_core.jobstore import RedisJobStore

from .conftest import ROOT, assert_exact, in_a_thread, killer


def rescaler(plan: list[tuple[float, str, int, str]], settle_s: float = 6.0):
    """Run each rescale `delay` seconds after the previous one finished, stop the sources
    `settle_s` after the last: however long a rescale takes on a loaded machine."""
    pending = list(plan)
    records: list[RescaleRecord] = []
    last = [0.0]

    def during(runtime, elapsed: float) -> None:
        if pending and elapsed - last[0] >= pending[0][0]:
            _, op, parallelism, strategy = pending.pop(0)
            records.append(runtime.rescale(op, parallelism, strategy))
            last[0] = elapsed + records[-1].rescale_s
        elif not pending and elapsed - last[0] >= settle_s:
            runtime.request_stop()

    during.records = records
    return during


@pytest.mark.side
def test_a_stateful_stage_survives_sigkills_then_a_cli_restart_rescale(redis_server, run):
    """Workers of a stateful user function are SIGKILLed mid-stream; then `streamjobs rescale` asks the
    running job for Flink's stop-and-restart baseline (2 -> 1): exact output throughout."""
    kills = killer([(4, "first-bid", 0), (8, "first-bid", 1), (11, "events", 0)])  # events runs `bids`, chained
    cli: list[subprocess.Popen] = []

    def during(runtime, elapsed: float) -> None:
        kills(runtime, elapsed)
        if elapsed > 14 and not cli:
            cli.append(subprocess.Popen(
                [sys.executable, "-m", "streamjobs.cli", "rescale", "--job", "new-bidders", "--operator", "first-bid",
                 "--parallelism", "1", "--strategy", "restart", "--redis-url", redis_server.url, "--wait", "300"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ))
        if cli and cli[0].poll() is not None:
            runtime.request_stop()  # the runtime's loop carried the request out; the command saw it finish

    report = run("tests/jobs/new-bidders.yaml", 600, during=during)
    out, err = cli[0].communicate(timeout=60)
    assert cli[0].returncode == 0, err
    assert len(kills.killed) == 3 and report["restarts"] >= 3
    assert json.loads(out) == report["rescales"][0]
    rescale = report["rescales"][0]
    assert (rescale["operator"], rescale["from"], rescale["to"], rescale["strategy"]) == ("first-bid", 2, 1, "restart")
    assert rescale["moved_key_groups"] > 0
    assert_exact(report)
    refused = subprocess.run(
        [sys.executable, "-m", "streamjobs.cli", "rescale", "--job", "new-bidders", "--operator", "nope",
         "--parallelism", "2", "--redis-url", redis_server.url], cwd=ROOT, capture_output=True, text=True,
    )
    assert refused.returncode == 2 and "--operator: no operator 'nope'" in refused.stderr


@pytest.mark.side
def test_all_at_once_fluid_and_batched_rescales_lose_nothing_through_sigkills(redis_server, run):
    """One job, three live rescales, four SIGKILLs:
    - all_at_once 2 -> 3 of a window stage: a standby killed while it warms up (the runtime restarts it
      inside the rescale), the new owner of the first key groups killed right after the handover;
    - fluid 3 -> 2 (a key group per step, markers in its streams): the old owner killed once the first
      marker is in (it finds the marker again after its restart), a new owner killed after taking over;
    - batched 1 -> 3 of the source (partitions released at a commit, 8 per step)."""
    r = redis.Redis.from_url(redis_server.url)
    keys = "sj:{wordcount-small}"
    killed: list[str] = []
    during = rescaler([(5, "count", 3, "all_at_once"), (2, "count", 2, "fluid"), (2, "words", 3, "batched")],
                      settle_s=6)

    def marker_in(stream: str) -> bool:
        return any(b"h" in fields for _, fields in r.xrange(stream))

    def kill_beside_the_rescales(runtime) -> None:  # a rescale blocks the runtime's loop
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and len(killed) < 4:
            standby = runtime.processes.standbys.get(("count", 1))
            if not killed and standby is not None and standby.process.poll() is None:
                time.sleep(1.0)  # mid warm-up
                standby.process.send_signal(signal.SIGKILL)
                killed.append("standby count/1")
            elif len(killed) == 2 and marker_in(f"{keys}:kg:words>count:4"):
                runtime.kill("count", 1)
                killed.append("old owner count/1")
            elif len(killed) == 3 and r.hlen(f"{keys}:acquired:count") >= 2:
                runtime.kill("count", 0)
                killed.append("new owner count/0")
            time.sleep(0.01)

    beside = in_a_thread(kill_beside_the_rescales)

    def chaos(runtime, elapsed: float) -> None:
        beside(runtime)
        if len(during.records) == 1 and len(killed) == 1:
            runtime.kill("count", 0)
            killed.append("new owner count/0")
        during(runtime, elapsed)

    report = run("tests/jobs/wordcount-small.yaml", 900, during=chaos)
    assert killed == ["standby count/1", "new owner count/0", "old owner count/1", "new owner count/0"]
    records = report["rescales"]
    assert [(x["operator"], x["from"], x["to"], x["strategy"]) for x in records] == [
        ("count", 2, 3, "all_at_once"), ("count", 3, 2, "fluid"), ("words", 1, 3, "batched")]
    assert records[1]["moved_key_groups"] == records[1]["steps"] == 6
    assert records[2]["moved_key_groups"] == 8 and records[2]["steps"] == 1
    assert report["restarts"] >= 4
    assert_exact(report)


def test_a_window_join_rescaled_2_4_2_batched_keeps_both_sides_through_sigkills_mid_handover(redis_server,
                                                                                               run_in_process):
    """Q8's join (a left join: unmatched persons are padded, so a lost person shows too) is scaled out and
    back in step by step while both inputs flow; a worker releasing key groups is SIGKILLed in the middle
    of each handover. Its buffered rows of both sides restart from the changelog and move on."""
    store = RedisJobStore(redis.Redis.from_url(redis_server.url), "q8-join")
    killed: list[str] = []
    during = rescaler([(6, "new-users", 4, "batched"), (3, "new-users", 2, "batched")], settle_s=8)

    def kill_mid_handover(runtime) -> None:  # a rescale blocks the runtime's loop
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and len(killed) < 2:
            state = store.rescale_state()
            moving = state is not None and state.phase == Phase.HANDOVER and 0 < len(store.acquired("new-users")) < 18
            if moving and not killed:
                runtime.kill("new-users", 0)  # an old owner of 2 -> 4, between its steps
                killed.append("new-users/0")
            elif moving and len(killed) == 1 and state.to_parallelism == 2:
                runtime.kill("new-users", 3)  # an old owner of 4 -> 2, retiring
                killed.append("new-users/3")
            time.sleep(0.005)

    beside = in_a_thread(kill_mid_handover)

    def chaos(runtime, elapsed: float) -> None:
        beside(runtime)
        during(runtime, elapsed)

    report = run_in_process("tests/jobs/q8-join.yaml", 900, during=chaos)
    assert len(killed) == 2 and report["restarts"] >= 2, killed
    records = report["rescales"]
    assert [(x["operator"], x["from"], x["to"], x["strategy"]) for x in records] == [
        ("new-users", 2, 4, "batched"), ("new-users", 4, 2, "batched")]
    assert all(x["moved_key_groups"] == 18 for x in records)
    assert report["verification"]["sinks"]["monitored"]["expected"] > 100
    assert_exact(report)
