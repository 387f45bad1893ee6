"""Rescaling a running job: the other operators keep going, the result stays exact."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

from .conftest import ROOT, assert_exact, killer


def rescaler(plan: list[tuple[float, str, int, str]], settle_s: float = 6.0):
    """Run each rescale `delay` seconds after the previous one finished, stop the sources
    `settle_s` after the last: however long a rescale takes on a loaded machine."""
    pending = list(plan)
    records: list[dict] = []
    last = [0.0]

    def during(runtime, elapsed: float) -> None:
        if pending and elapsed - last[0] >= pending[0][0]:
            _, op, parallelism, strategy = pending.pop(0)
            records.append(runtime.rescale(op, parallelism, strategy))
            last[0] = elapsed + records[-1]["rescale_s"]
        elif not pending and elapsed - last[0] >= settle_s:
            runtime.request_stop()

    during.records = records
    return during


def test_a_stateful_stage_survives_sigkills_then_a_cli_restart_rescale(redis_server, run):
    """Workers of a stateful user function are SIGKILLed mid-stream; then `streamjobs rescale` asks the
    running job for Flink's stop-and-restart baseline (2 -> 1): exact output throughout."""
    kills = killer([(4, "first-bid", 0), (8, "first-bid", 1), (11, "bids", 0)])
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


def test_kills_of_a_standby_in_prestage_and_of_a_new_owner_after_handover_lose_nothing(run):
    """SIGKILL a warming-up standby (the runtime restarts it inside the rescale) and, right after the
    handover, the new owner of the first key groups (it restores from the committed state)."""
    killed: list[str] = []
    during = rescaler([(5, "count", 3, "all_at_once")], settle_s=10)

    def kill_a_standby(runtime) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            standby = runtime.standbys.get(("count", 1))
            if standby is not None and standby.process.poll() is None:
                time.sleep(1.0)  # mid warm-up
                standby.process.send_signal(signal.SIGKILL)
                killed.append("standby count/1")
            time.sleep(0.05)

    def chaos(runtime, elapsed: float) -> None:
        if not hasattr(chaos, "thread"):
            chaos.thread = threading.Thread(target=kill_a_standby, args=(runtime,), daemon=True)
            chaos.thread.start()
        if during.records and len(killed) == 1:
            runtime.kill("count", 0)
            killed.append("new owner count/0")
        during(runtime, elapsed)

    report = run("examples/wordcount.yaml", 600, during=chaos)
    assert killed == ["standby count/1", "new owner count/0"]
    assert [(r["from"], r["to"]) for r in report["rescales"]] == [(2, 3)]
    assert report["restarts"] >= 2
    assert_exact(report)
