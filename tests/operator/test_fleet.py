"""The Kubernetes Fleet against the emulated API server and a real Redis, without the kopf process or workers:
what a scale-out waits for before the controller moves key groups."""

from __future__ import annotations

import pytest
from streamjobs_core.control import InstanceAddress
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_operator import reconcile
from streamjobs_operator.config import Settings

from .jobs import job_id, window_counts


def test_a_scale_out_without_spares_waits_for_the_added_pods_workers_to_register(kube, redis_client, redis_server):
    """A pod is ready once its container runs, seconds before its worker has Spark up and can take a key group.
    A registration a crash left at an ordinal no pod holds is no such worker."""
    body = kube.ensure("streamjobs", window_counts("growing", rescale={"strategy": "batched"}))
    ctx = reconcile.JobContext.of(body, kube, Settings(default_redis_url=redis_server.url, ready_timeout_s=1.0))
    jobs = RedisJobStore(redis_client, job_id("growing"))
    fleet = ctx.fleet(redis_client)
    fleet.ensure(fleet.build("counts", 1, 1, False), 1)
    jobs.register(InstanceAddress("counts", 0, "10.0.0.1:9400"))
    jobs.register(InstanceAddress("counts", 1, "10.0.0.9:9400"))  # the pod of an earlier scale-out, crashed

    sts = fleet.current("counts")
    kube.patch("statefulsets", sts["metadata"]["namespace"], sts["metadata"]["name"],
               {"status": {"replicas": 2, "readyReplicas": 2}}, subresource="status")  # both containers run
    with pytest.raises(TimeoutError, match=r"pods \[1\] of counts did not change role"):
        fleet.add_instances("counts", 2)
    assert fleet.current("counts")["spec"]["replicas"] == 2

    jobs.register(InstanceAddress("counts", 1, "10.0.0.2:9400"))  # its worker is up
    fleet.add_instances("counts", 2)  # what a resumed controller repeats: nothing more to wait for
    assert fleet.current("counts")["spec"]["replicas"] == 2 and ("counts", 1) in jobs.registered()
