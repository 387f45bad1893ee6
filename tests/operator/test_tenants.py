"""Tenants on one Redis: StreamJobs of one name in two namespaces keep to their own keys, and their workers' Redis
users reach nothing else."""

from __future__ import annotations

import pytest
import redis
from streamjobs_core.connect import Credentials, connect
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import JobKeys
from streamjobs_operator.resources import JobAccess, Owner

from .conftest import TENANTS, await_deleted, eventually
from .jobs import job_id


def _copy_job(namespace: str) -> dict:
    """Records producers XADD, copied to a Redis stream sink: no Spark, and an input stream of its own."""
    return {"apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob",
            "metadata": {"name": "shared", "namespace": namespace},
            "spec": {"maxParallelism": 12,
                     "sources": [{"name": "events", "type": "redis_stream"}],
                     "sinks": [{"name": "copies", "type": "redis_stream", "inputs": ["events"], "chain": False}],
                     "batching": {"minIntervalMs": 100, "maxWaitMs": 50}}}


def _produce(r, keys: JobKeys, first: int, count: int) -> None:
    for n in range(first, first + count):
        r.xadd(keys.input_stream("events", 0), {"n": str(n)})


def _copied(r, keys: JobKeys) -> list[int]:
    return sorted(int(fields[b"n"]) for _, fields in r.xrange(keys.output_stream("copies")))


def _running(kube, namespace: str) -> bool:
    return ((kube.get("streamjobs", namespace, "shared") or {}).get("status") or {}).get("phase") == "Running"


def test_a_job_of_the_same_name_in_another_namespace_neither_touches_its_keys_nor_takes_them_on_deletion(
        kube, kubelet, redis_client, redis_server):
    first, second = TENANTS
    a, b = JobKeys(job_id("shared", first)), JobKeys(job_id("shared", second))
    try:
        uid_a = kube.ensure("streamjobs", _copy_job(first))["metadata"]["uid"]
        eventually(lambda: _running(kube, first), 90, f"{first}/shared running")
        _produce(redis_client, a, 0, 100)
        eventually(lambda: len(_copied(redis_client, a)) == 100, 60, f"{first}'s records copied")

        kube.ensure("streamjobs", _copy_job(second))
        eventually(lambda: _running(kube, second), 90, f"{second}/shared running")
        _produce(redis_client, b, 1000, 50)
        eventually(lambda: len(_copied(redis_client, b)) == 50, 60, f"{second}'s records copied")
        assert _copied(redis_client, a) == list(range(100)), "the second job's deploy touched the first's output"
        # What the first job's workers log in with reaches its keys only, whatever their code does.
        user = JobAccess.of(Owner("shared", first, uid_a))
        worker = connect(redis_server.url, Credentials(user.username, kube.secret_value(first, user.secret, "password")))
        assert worker.xlen(a.output_stream("copies")) == 100
        for command in (lambda: worker.get(b.plan), lambda: worker.xrange(b.output_stream("copies")),
                        lambda: worker.xadd(b.input_stream("events", 0), {"n": "-1"}), lambda: worker.delete(b.plan)):
            with pytest.raises(redis.exceptions.NoPermissionError):
                command()
        worker.close()

        kube.delete("streamjobs", second, "shared")
        await_deleted(kube, kubelet, "shared", namespace=second)
        assert list(redis_client.scan_iter(match=b.pattern)) == [], "the deleted job's keys stay"
        assert redis_client.acl_getuser(JobAccess.of(Owner("shared", second, "")).username) is None
        jobs = RedisJobStore(redis_client, a.job)
        assert jobs.deployed_by() == uid_a and jobs.plan() is not None
        assert redis_client.xlen(a.input_stream("events", 0)) == 100
        # And it keeps running: new input is copied, each record once.
        _produce(redis_client, a, 100, 100)
        eventually(lambda: len(_copied(redis_client, a)) >= 200, 60, f"{first}'s new records copied")
        assert _copied(redis_client, a) == list(range(200))
    finally:
        for namespace in TENANTS:
            kube.delete("streamjobs", namespace, "shared")
        for namespace in TENANTS:
            await_deleted(kube, kubelet, "shared", namespace=namespace)
