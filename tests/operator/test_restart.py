"""The operator is killed (SIGKILL) in the middle of a rescale; a new operator process resumes it.

The rescale controller persists its phase in Redis; the new operator's resume
handler and rescaler daemon finish or roll back what it finds there, then reach
the spec's parallelism. The output stays exact.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import JobKeys
from streamjobs_operator.resources import LABEL_JOB

from .conftest import NAMESPACE, assert_exact_after_stop, await_deleted, eventually
from .jobs import job_id, wordcopy
from .kubelet import Kubelet


def _start_operator(emulator, redis_server, log) -> subprocess.Popen:
    env = {**os.environ, "KUBECONFIG": str(emulator.kubeconfig), "STREAMJOBS_DEFAULT_REDIS_URL": redis_server.url,
           "STREAMJOBS_STATUS_INTERVAL_S": "1", "STREAMJOBS_READY_TIMEOUT_S": "120", "STREAMJOBS_REDIS_ACL": "true"}
    return subprocess.Popen([sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces",
                             "-m", "streamjobs_operator.handlers"], env=env, stdout=log, stderr=subprocess.STDOUT)


def _phase(r, keys: JobKeys) -> str | None:
    state = RedisJobStore(r, keys.job).rescale_state()
    return state.phase if state else None


@pytest.fixture
def operator_processes(emulator, redis_server, tmp_path):
    started: list[subprocess.Popen] = []
    log = open(tmp_path / "operator.log", "ab")

    def start() -> subprocess.Popen:
        started.append(_start_operator(emulator, redis_server, log))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
            process.wait(30)
    log.close()


def test_a_rescale_interrupted_by_an_operator_crash_is_resumed(emulator, kube, redis_client, operator_processes,
                                                                  tmp_path):
    first = operator_processes()
    with Kubelet(kube, tmp_path) as kubelet:
        doc = wordcopy("survivor", sink_parallelism=1)
        kube.ensure("streamjobs", doc)
        keys = JobKeys(job_id("survivor"))
        eventually(lambda: redis_client.xlen(keys.output_stream("copies")) > 0, 90, "sink output")

        kube.patch("streamjobs", NAMESPACE, "survivor",
                   {"spec": {"sinks": [{**doc["spec"]["sinks"][0], "parallelism": 3}]}})
        # Kill it during the handover: the old instances are stopping, the standbys wait for the new epoch.
        # (A kill in PRESTAGE rolls back, which the rescale controller's own tests cover.)
        deadline = time.monotonic() + 60
        while _phase(redis_client, keys) != "HANDOVER" and time.monotonic() < deadline:
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert _phase(redis_client, keys) in ("HANDOVER", "RETIRE"), "not killed in the middle of the handover"

        operator_processes()  # a new operator process: its handlers find the persisted rescale
        jobs = RedisJobStore(redis_client, keys.job)
        eventually(lambda: jobs.rescale_state() is None and jobs.assignment("copies").parallelism == 3, 120,
                   "rescale finished")
        names = lambda: {s["metadata"]["name"] for s in kube.list("statefulsets", NAMESPACE, {LABEL_JOB: "survivor"})}
        final = jobs.assignment("copies").epoch
        eventually(lambda: names() == {"survivor-words-e1", f"survivor-copies-e{final}"}, 60, "old StatefulSets gone")
        before = redis_client.xlen(keys.output_stream("copies"))
        eventually(lambda: redis_client.xlen(keys.output_stream("copies")) > before, 60, "output after the rescale")

        assert_exact_after_stop(redis_client, "survivor", sink_instances=3, at_least=500)
        assert not kubelet.errors
        kube.delete("streamjobs", NAMESPACE, "survivor")
        await_deleted(kube, kubelet, "survivor")
