"""The operator under kopf's KopfRunner against kmock's emulated API server, a real Redis, and
(for tests that want pods to run) a kubelet stand-in that starts real worker processes.

One emulator, one operator and one kubelet per module: each test uses jobs of its own names.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable

import kubernetes
import pytest
import yaml
from kopf.testing import KopfRunner
from streamjobs_operator.kube import Kube

from .emulator import Emulator
from .kubelet import Kubelet

NAMESPACE = "default"
TENANTS = ("tenant-a", "tenant-b")  # namespaces of tests that need more than one


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with Emulator(tmp_path_factory.mktemp("kmock")) as emu:
        yield emu


@pytest.fixture(scope="module")
def kube(emulator) -> Kube:
    return Kube(kubernetes.config.new_client_from_config(str(emulator.kubeconfig)))


@pytest.fixture(scope="module")
def savepoints(tmp_path_factory):
    """Where the operator reads `spec.restoreFrom` from (the chart's savepoint mount)."""
    return tmp_path_factory.mktemp("savepoints")


@pytest.fixture(scope="module")
def operator(emulator, redis_server, savepoints):
    """`kopf run -m streamjobs_operator.handlers`, logged in through the emulator's kubeconfig; each job's workers
    connect as the job's own Redis user."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(emulator.kubeconfig))
        # kopf logs in with kubernetes.config.load_kube_config(), whose default path was read at import.
        mp.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(emulator.kubeconfig))
        mp.setenv("STREAMJOBS_DEFAULT_REDIS_URL", redis_server.url)
        mp.setenv("STREAMJOBS_STATUS_INTERVAL_S", "1")
        mp.setenv("STREAMJOBS_READY_TIMEOUT_S", "120")
        mp.setenv("STREAMJOBS_REDIS_ACL", "true")
        mp.setenv("STREAMJOBS_SAVEPOINT_DIR", str(savepoints))
        # The whole operator process: the handlers plus the autoscaler daemon per StreamJob.
        args = ["run", "--standalone", "--all-namespaces", "-m", "streamjobs.controller"]
        with KopfRunner(args, timeout=60) as runner:
            yield runner
    assert runner.exception is None, runner.output


@pytest.fixture(scope="module")
def kubelet(kube, operator, tmp_path_factory):
    with Kubelet(kube, tmp_path_factory.mktemp("pods"), namespaces=(NAMESPACE, *TENANTS)) as k:
        yield k
    assert not k.errors, k.errors


@pytest.fixture
def redis_client(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def run_kubectl(emulator, *args: str) -> str:
    """kubectl (on the machine image) against the emulator."""
    env = {**os.environ, "KUBECONFIG": str(emulator.kubeconfig)}
    cache = f"--cache-dir={emulator.kubeconfig.parent / 'kubectl-cache'}"  # not ~/.kube of whoever runs the tests
    out = subprocess.run(["kubectl", cache, *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def job(emulator, kube, kubelet, tmp_path):
    """Apply StreamJobs for one test; delete them afterwards (through the finalizer), so the workers of
    earlier tests do not compete for the two cores."""
    names: list[str] = []

    def apply(doc: dict, kubectl: bool = False) -> dict:
        names.append(doc["metadata"]["name"])
        if kubectl:  # the users' path: `kubectl apply -f job.yaml`
            path = tmp_path / f"{names[-1]}.yaml"
            path.write_text(yaml.safe_dump(doc))
            run_kubectl(emulator, "apply", "--validate=false", "-f", str(path))
            created = kube.get("streamjobs", NAMESPACE, names[-1])
        else:
            created = kube.ensure("streamjobs", doc)
        eventually(lambda: ((kube.get("streamjobs", NAMESPACE, names[-1]) or {}).get("status") or {}).get("phase")
                   == "Running", 90, f"{names[-1]} running")
        return created

    yield apply
    for name in names:
        kube.delete("streamjobs", NAMESPACE, name)
    for name in names:
        await_deleted(kube, kubelet, name)


def await_deleted(kube: Kube, kubelet: Kubelet | None, name: str, timeout_s: float = 120.0,
                  namespace: str = NAMESPACE) -> None:
    """Wait until StreamJob `name`, deleted, is gone: its finalizer stopped its workers and cleared its Redis.

    A job still warming up goes once its create handler lets go, slow on a busy machine. A timeout says what
    held the deletion up: the job's finalizers and kopf's handler progress, and its workers still running.
    """
    deadline = time.monotonic() + timeout_s
    while (body := kube.get("streamjobs", namespace, name)) is not None:
        if time.monotonic() > deadline:
            meta = body.get("metadata") or {}
            progress = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("streamjobs.dev/")}
            running = [] if kubelet is None else [
                f"{pod.name}{' (terminating)' if pod.terminating else ''}" for pod in list(kubelet.pods.values())
                if pod.namespace == namespace and pod.name.startswith(f"{name}-") and pod.process.poll() is None]
            pytest.fail(f"{name} not deleted after {timeout_s:.0f} s: finalizers {meta.get('finalizers')}, "
                        f"deletionTimestamp {meta.get('deletionTimestamp')}, workers running {running}, "
                        f"kopf progress {progress}")
        time.sleep(0.2)


def events(emulator, name: str) -> list[dict]:
    """The Kubernetes Events about object `name` (kopf posts them to the core v1 API)."""
    api = kubernetes.config.new_client_from_config(str(emulator.kubeconfig))
    raw = kubernetes.client.CoreV1Api(api).list_namespaced_event(NAMESPACE, _preload_content=False)
    return [e for e in json.loads(raw.data)["items"] if e.get("involvedObject", {}).get("name") == name]


def eventually(check: Callable[[], object], timeout_s: float = 60.0, message: str = "") -> object:
    """Poll until `check` returns a truthy value; fail with the last value seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s: {message} (last: {value!r})")
        time.sleep(0.2)


def assert_exact_after_stop(r, job: str, sink_instances: int, at_least: int, drain_s: float = 60.0) -> None:
    """Stop the sources, let the `sink_instances` sinks drain, and compare the wordcopy job's output with
    the source's committed input record by record: 0 lost, 0 duplicated."""
    from streamjobs_core.jobstore import RedisJobStore

    from .jobs import committed_input, job_id, sink_output

    jobs = RedisJobStore(r, job_id(job))
    jobs.request_stop()
    eventually(lambda: r.scard(jobs.keys.done("copies")) >= sink_instances, drain_s, "sinks drained")
    plan = jobs.plan()
    expected, actual = committed_input(r, plan, "words"), sink_output(r, plan, "copies")
    assert sum(expected.values()) > at_least
    assert (sum((expected - actual).values()), sum((actual - expected).values())) == (0, 0)
