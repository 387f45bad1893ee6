"""reconcile.deploy against the emulated API server and a real Redis, without the kopf process or workers: what
it waits for before the sources start."""

from __future__ import annotations

import pytest
from streamjobs_core.control import InstanceAddress
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_operator import reconcile, status
from streamjobs_operator.config import Settings
from streamjobs_operator.resources import LABEL_JOB

from .conftest import NAMESPACE
from .jobs import job_id, window_counts


def test_a_job_waits_for_its_warm_spares_at_most_the_ready_timeout_then_starts_without_them(kube, redis_client,
                                                                                           redis_server):
    body = kube.ensure("streamjobs", window_counts("unplaced", rescale={"strategy": "fluid", "spareInstances": 1}))
    ctx = reconcile.JobContext.of(body, kube, Settings(default_redis_url=redis_server.url, ready_timeout_s=30.0))
    reported = []

    def deploy(waited_s: float) -> str:
        return reconcile.deploy(ctx, body, lambda reason, record: reported.append((reason, record)), waited_s)

    with pytest.raises(reconcile.NotReady, match=r"2 stage and sink workers to warm up: counts/0, counts/pod-1$"):
        deploy(0.0)
    # The stage's instance is up; its spare's pod was never scheduled.
    RedisJobStore(redis_client, job_id("unplaced")).register(InstanceAddress("counts", 0, "10.0.0.1:9400"))
    with pytest.raises(reconcile.NotReady, match=r": counts/pod-1$"):
        deploy(29.0)
    sets = {s["metadata"]["name"] for s in kube.list("statefulsets", NAMESPACE, {LABEL_JOB: "unplaced"})}
    assert sets == {"unplaced-counts-e1"}  # no source before the instances (and, for a while, the spares)

    assert deploy(30.0) == status.RUNNING
    assert reported == [("SparesNotReady", {"spares": ["counts/pod-1"], "waitedS": 30,
                                            "message": "the job starts without them; a scale-out waits for their pods"})]
    sets = {s["metadata"]["name"] for s in kube.list("statefulsets", NAMESPACE, {LABEL_JOB: "unplaced"})}
    assert sets == {"unplaced-counts-e1", "unplaced-words-e1"}
