"""A StreamJob created with `spec.restoreFrom` goes on from a savepoint of an earlier one: state, offsets and
outputs, under another maxParallelism (the savepoint taken drained), its spec's changes applied as an edit's (a
window's, with the reset-state annotation); a savepoint it cannot take is refused, naming the field."""

from __future__ import annotations

import json
import subprocess
import sys

from streamjobs import oracle
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_worker.ports import Ports

from .conftest import NAMESPACE, await_deleted, events, eventually
from .jobs import apply, get, job_id, phase, window_counts


def test_a_job_restored_from_a_savepoint_goes_on_rescaled_and_exact(
        emulator, kube, kubelet, redis_client, redis_server, job, spark, savepoints):
    job(window_counts("saved", parallelism=1))
    jobs = RedisJobStore(redis_client, job_id("saved"))
    out = jobs.keys.output_stream("totals")
    eventually(lambda: redis_client.xlen(out) > 30, 120, "window results")
    path = savepoints / "saved.savepoint"
    taken = subprocess.run([sys.executable, "-m", "streamjobs.cli", "savepoint", "--job", job_id("saved"), "--redis-url",
                            redis_server.url, "--path", str(path), "--drain-in-flight"], capture_output=True, text=True,
                           timeout=60)
    assert taken.returncode == 0 and "drained" in taken.stdout, taken.stderr
    assert jobs.paused_at(0) is None  # the sources went on after the copy
    written = redis_client.xrange(out, count=30)
    t0 = jobs.plan().t0_ms
    kube.delete("streamjobs", NAMESPACE, "saved")  # its finalizer deletes every key of the job
    await_deleted(kube, kubelet, "saved")
    assert redis_client.xlen(out) == 0

    # Restored under 16 key groups (was 12), whose state is split again, and with a longer window, which its state
    # depends on: the annotation starts that state afresh.
    # Grown by a batched scale-out without spares: the added pod is ready (its container runs) well before its
    # worker can take key groups.
    restored = window_counts("saved", parallelism=2, restoreFrom=str(path), maxParallelism=16,
                             rescale={"strategy": "batched"})
    restored["spec"]["stages"][0]["window"]["sizeMs"] = 2000
    restored["metadata"]["annotations"] = {"streamjobs.dev/reset-state": "counts"}
    job(restored)
    eventually(lambda: jobs.assignment("counts").parallelism == 2, 180, "the restored job rescaled")
    done = eventually(lambda: [json.loads(e["message"]) for e in events(emulator, "saved")
                               if e["reason"] == "Reconfigured"], 60, "a Reconfigured event")
    assert "spec.stages[counts].window: live" in done[0]["changes"] and jobs.plan().resets == ("counts",)
    eventually(lambda: "streamjobs.dev/reset-state" not in (get(kube, "saved")["metadata"].get("annotations")
                                                             or {}), 30, "the annotation removed")
    assert jobs.plan_version(1).spec.max_parallelism == 16  # the re-split is a version of its own
    assert set(jobs.resets(2, "counts")) == set(range(16))
    assert jobs.plan().t0_ms == t0  # event time goes on from the first run's origin
    assert redis_client.xrange(out, count=30) == written
    more = redis_client.xlen(out) + 30
    eventually(lambda: redis_client.xlen(out) > more, 120, "results after the restore")
    eventually(lambda: [e for e in events(emulator, "saved") if e["reason"] == "Rescaled"], 30, "a Rescaled event")
    jobs.request_stop()
    # Every instance of the sink's chain (counts, 2 now) says it drained: one alone leaves the other's last windows.
    eventually(lambda: redis_client.scard(jobs.keys.done("totals")) >= 2, 90, "the sink drained")
    plan = jobs.plan()
    verdict = oracle.verify(spark, Ports.over_redis(redis_client, plan.id), plan)
    assert (verdict["correct"], verdict["lost"], verdict["duplicated"]) == (True, 0, 0), verdict


def test_a_savepoint_the_spec_cannot_take_is_refused_naming_the_field(emulator, kube, operator, savepoints):
    apply(kube, window_counts("unsaved", restoreFrom=str(savepoints / "missing.savepoint")))
    eventually(lambda: [e for e in events(emulator, "unsaved") if e["reason"] == "Rejected"], 30, "a Rejected event")
    rejected = next(e for e in events(emulator, "unsaved") if e["reason"] == "Rejected")
    assert "spec.restoreFrom: cannot read savepoint" in rejected["message"]
    assert phase(kube, "unsaved") != "Running"
    kube.delete("streamjobs", NAMESPACE, "unsaved")
    eventually(lambda: kube.get("streamjobs", NAMESPACE, "unsaved") is None, 30, "unsaved deleted")

    # Only files under the operator's savepoint mount: not a device, not a file of the operator's own.
    apply(kube, window_counts("zeroes", restoreFrom="/dev/zero"))
    rejected = eventually(lambda: [e for e in events(emulator, "zeroes") if e["reason"] == "Rejected"], 30, "event")
    assert f"spec.restoreFrom: /dev/zero is not under {savepoints}" in rejected[0]["message"]
    kube.delete("streamjobs", NAMESPACE, "zeroes")
    eventually(lambda: kube.get("streamjobs", NAMESPACE, "zeroes") is None, 30, "zeroes deleted")
