"""The whole loop on the emulated cluster: real workers' metrics -> the autoscaler daemon decides ->
the spec is edited -> the operator rescales live -> Events and status tell why; the output stays exact."""

from __future__ import annotations

from streamjobs_core.jobstore import RedisJobStore

from .conftest import assert_exact_after_stop, events, eventually
from .jobs import get, job_id, wordcopy

# One sink instance copies 100 of the 150 rec/s (10 ms each), so its backlog grows for sure; two keep up.
# reactive with a threshold that backlog exceeds: a decision within seconds, bounded at 2 instances.
AUTOSCALER = {"policy": "reactive", "intervalS": 1, "metricsWindowS": 3, "stabilizationS": 2,
              "activationIntervals": 1, "lagHighRecords": 20, "lagLowRecords": 0, "maxParallelism": 2}


def test_the_autoscaler_daemon_rescales_the_job_live_and_explains_why(emulator, kube, kubelet, redis_client, job):
    job(wordcopy("autoscaled", sink_parallelism=1, sink_cost_us=10_000, autoscaler=AUTOSCALER))
    jobs = RedisJobStore(redis_client, job_id("autoscaled"))
    keys = jobs.keys
    eventually(lambda: (a := jobs.assignment("copies")) is not None and a.parallelism == 2, 180, "copies scaled to 2")
    assert get(kube, "autoscaled")["spec"]["sinks"][0]["parallelism"] == 2  # the decision went through the spec
    scaled = eventually(lambda: [e for e in events(emulator, "autoscaled") if e["reason"] == "ScaledUp"
                                 and e["message"].startswith("copies 1 -> 2")], 60, "a ScaledUp event for copies")
    assert "backlog" in scaled[0]["message"] and "reactive" in scaled[0]["message"]
    status = eventually(lambda: get(kube, "autoscaled").get("status", {}).get("decisions"), 30, "decisions in status")
    assert any(d["executed"] and "copies 1 -> 2" in d["summary"] for d in status)
    assert "copies 1 -> 2" in get(kube, "autoscaled")["status"]["lastDecision"] or len(status) > 1
    (rescale,) = eventually(lambda: get(kube, "autoscaled")["status"].get("rescales"), 30, "the rescale in the history")
    assert (rescale["from"], rescale["to"]) == (1, 2) and rescale["why"].startswith("copies 1 -> 2 [reactive")

    before = redis_client.xlen(keys.output_stream("copies"))
    eventually(lambda: redis_client.xlen(keys.output_stream("copies")) > before, 60, "output after the rescale")
    assert_exact_after_stop(redis_client, "autoscaled", sink_instances=2, at_least=500, drain_s=90)
