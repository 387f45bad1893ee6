"""The whole loop on the emulated cluster: real workers' metrics -> the autoscaler daemon decides ->
the spec is edited -> the operator rescales live, promoting a warm spare pod -> Events and status tell why; a
scale-in turns the emptied instance back into a spare where it runs; the output stays exact."""

from __future__ import annotations

import time

from streamjobs import oracle
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_worker.ports import Ports

from .conftest import events, eventually
from .jobs import NAMESPACE, _streamjob, get, job_id

# One `tag` instance passes 100 of the 150 rec/s (10 ms each), so its backlog grows for sure; two keep up.
# reactive with a threshold that backlog exceeds: a decision within seconds, bounded at 2 instances.
AUTOSCALER = {"policy": "reactive", "intervalS": 1, "metricsWindowS": 3, "stabilizationS": 2,
              "activationIntervals": 1, "lagHighRecords": 20, "lagLowRecords": 0, "maxParallelism": 2}


TAG = {"name": "tag", "type": "sql", "inputs": ["words"], "chain": False, "simulatedCostUs": 10_000,
       "query": "SELECT word, event_time FROM input"}


def _spared(name: str) -> dict:
    """Words through a Spark SQL stage of its own (10 ms a record) to a sink; one warm spare pod for `tag`."""
    return _streamjob(name, {
        "stages": [TAG],
        "sinks": [{"name": "copies", "type": "redis_stream", "inputs": ["tag"], "chain": False}],
        # A scale-out comes with a backlog: at 10 ms a record, the moved key groups go at the old owner's next
        # commit (a batch of at most 1 s) with their backlog rather than behind it at an in-band marker.
        "batching": {"minIntervalMs": 100, "maxWaitMs": 50, "maxRecords": 100},
        "rescale": {"strategy": "batched", "spareInstances": 1, "markerMaxLagRecords": 50},
        "autoscaler": AUTOSCALER,
    })


def test_the_autoscaler_daemon_rescales_live_onto_a_warm_spare_and_a_scale_in_makes_it_a_spare_again(
        emulator, kube, kubelet, redis_client, job, spark, record_property):
    job(_spared("autoscaled"))
    jobs = RedisJobStore(redis_client, job_id("autoscaled"))
    # Running means the spare pod (ordinal 1, beyond the one instance) is warm too.
    assert jobs.ready_spares("tag") == {"pod-1"} and "autoscaled-tag-e1-1" in kubelet.started

    decided = eventually(lambda: get(kube, "autoscaled")["spec"]["stages"][0].get("parallelism") == 2
                         and time.time(), 180, "the autoscaler's edit of tag's parallelism")
    started_before = list(kubelet.started)
    scaled = eventually(lambda: [r for r in jobs.rescale_history() if r.to_parallelism == 2], 120, "tag scaled to 2")
    in_effect_s = scaled[0].ended_at - decided
    # The figure for the record (`pytest --junitxml`): seconds from the autoscaler's edit to the rescale's end.
    record_property("decision_in_effect_s", round(in_effect_s, 1))
    record_property("rescale_s", scaled[0].rescale_s)
    # The instance came from the spare pod, warm: no pod started for it; the StatefulSet's new pod is the next spare.
    assert jobs.assignment("tag").parallelism == 2 and ("tag", 1) in jobs.registered()
    assert [name for name in kubelet.started[len(started_before):] if name.startswith("autoscaled-tag")] in (
        [], ["autoscaled-tag-e1-2"])
    assert in_effect_s < scaled[0].rescale_s + 10  # the rescale itself, not a JVM start, is what it waited for
    eventually(lambda: jobs.ready_spares("tag") == {"pod-2"}, 120, "the next spare warm")
    operators = eventually(lambda: (s := get(kube, "autoscaled").get("status", {}).get("operators", {}).get("tag"))
                           and s.get("currentParallelism") == 2 and s.get("readySpares") == 1 and s, 60,
                           "2 instances and 1 spare in the status")
    assert operators["assignedParallelism"] == 2
    scaled_up = eventually(lambda: [e for e in events(emulator, "autoscaled") if e["reason"] == "ScaledUp"
                                    and e["message"].startswith("tag 1 -> 2")], 60, "a ScaledUp event for tag")
    assert "backlog" in scaled_up[0]["message"] and "reactive" in scaled_up[0]["message"]
    (rescale, *_) = eventually(lambda: get(kube, "autoscaled")["status"].get("rescales"), 30, "the rescale history")
    assert (rescale["from"], rescale["to"]) == (1, 2) and rescale["why"].startswith("tag 1 -> 2 [reactive")

    # A scale-in by a spec edit: instance 1 is emptied and waits as the spare again, in the same process; the
    # pod beyond it goes. (The autoscaler then scales out again onto it.)
    kube.patch("streamjobs", NAMESPACE, "autoscaled", {"spec": {"stages": [{**TAG, "parallelism": 1}]}})
    eventually(lambda: [r for r in jobs.rescale_history() if r.to_parallelism == 1], 120, "tag scaled to 1")
    eventually(lambda: "pod-1" in jobs.ready_spares("tag"), 60, "instance 1 a spare again")
    pod = kubelet.pods[NAMESPACE, "autoscaled-tag-e1-1"]
    assert pod.restarts == 0 and kubelet.started.count("autoscaled-tag-e1-1") == 1
    again = eventually(lambda: [r for r in jobs.rescale_history() if r.to_parallelism == 2][1:], 120,
                       "the autoscaler's second scale-out")
    assert kubelet.started.count("autoscaled-tag-e1-1") == 1 and again[0].from_parallelism == 1

    jobs.request_stop()
    eventually(lambda: redis_client.scard(jobs.keys.done("copies")) >= 1, 90, "the sink drained")
    plan = jobs.plan()
    verdict = oracle.verify(spark, Ports.over_redis(redis_client, plan.id), plan)
    assert (verdict["correct"], verdict["lost"], verdict["duplicated"]) == (True, 0, 0), verdict
