"""`streamjobs control` and `streamjobs rebalance` against a StreamJob the operator runs: the operator carries
out what they leave in the job's Redis (a control event at a sync point, a rebalance's moves) with an Event, and
refuses to have its parallelism or spec changed that way."""

from __future__ import annotations

import json
import subprocess
import sys

from streamjobs import oracle
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_worker.ports import Ports

from .conftest import events, eventually
from .jobs import job_id, window_counts


def cli(redis_server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamjobs.cli", *args, "--job", job_id("asked"), "--redis-url",
                           redis_server.url], capture_output=True, text=True, timeout=240)


def test_a_control_event_and_a_rebalance_asked_from_the_cli_are_carried_out_in_place(
        emulator, kube, kubelet, redis_client, redis_server, job, spark):
    job(window_counts("asked", parallelism=2))
    jobs = RedisJobStore(redis_client, job_id("asked"))
    out = jobs.keys.output_stream("totals")
    eventually(lambda: redis_client.xlen(out) > 50, 120, "window results")
    pods = list(kubelet.started)

    load = cli(redis_server, "control", "--operator", "counts", "--event", "load", "--wait", "120")
    assert load.returncode == 0, load.stderr
    record = json.loads(load.stdout)
    assert set(record["replies"]) == {"counts/0", "counts/1"}
    # Each instance answered at the event's cut: its key groups had read exactly what the source emitted before it.
    emitted = sum(int(offset) for offset in jobs.cut(record["version"]).values())
    assert sum(n for reply in record["replies"].values() for n in reply["records"].values()) == emitted > 0
    eventually(lambda: [e for e in events(emulator, "asked") if e["reason"] == "ControlEvent"], 30,
               "a ControlEvent event")

    before = jobs.assignment("counts")
    moved = cli(redis_server, "rebalance", "--operator", "counts", "--measure-s", "3", "--wait", "180")
    assert moved.returncode == 0, moved.stderr
    planned, rescaled = (json.loads(line) for line in moved.stdout.splitlines()[-2:])
    assert planned["moves"] > 0 and planned["busiest_share_after"] < planned["busiest_share_before"]
    assert rescaled["from"] == rescaled["to"] == 2 and rescaled["strategy"] == "batched"
    after = jobs.assignment("counts")
    assert after.parallelism == 2 and sum(a != b for a, b in zip(before.owners, after.owners)) == planned["moves"]
    assert kubelet.started == pods  # moved between the running pods: none started
    eventually(lambda: [e for e in events(emulator, "asked") if e["reason"] == "Rebalanced"], 30, "a Rebalanced event")

    refused = cli(redis_server, "rescale", "--operator", "counts", "--parallelism", "3")
    assert refused.returncode == 2 and "run by the StreamJob operator" in refused.stderr

    jobs.request_stop()
    eventually(lambda: redis_client.scard(jobs.keys.done("totals")) >= 1, 90, "the sink drained")
    plan = jobs.plan()
    verdict = oracle.verify(spark, Ports.over_redis(redis_client, plan.id), plan)
    assert (verdict["correct"], verdict["lost"], verdict["duplicated"]) == (True, 0, 0), verdict
