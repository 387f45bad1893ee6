"""A live rescale driven by the operator: a spec edit -> new StatefulSet of standbys -> handover -> old one gone
(all_at_once, a window stage on Spark), or more pods of the same StatefulSet taking key groups over (fluid).

Real worker processes (started by the kubelet stand-in) carry the data; the
result is checked record by record against the source's committed input.
"""

from __future__ import annotations

import json

from streamjobs import oracle
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import JobKeys
from streamjobs_operator.autoscaling import SpecScaler, StatusDecisionLog
from streamjobs_operator.resources import LABEL_JOB, Owner
from streamjobs_worker.ports import Ports

from .conftest import NAMESPACE, assert_exact_after_stop, events, eventually
from .jobs import get, job_id, window_counts, wordcopy


def _statefulsets(kube, job: str) -> dict[str, dict]:
    return {s["metadata"]["name"]: s for s in kube.list("statefulsets", NAMESPACE, {LABEL_JOB: job})}


def _set_sink_parallelism(kube, doc: dict, parallelism: int) -> None:
    sinks = [{**doc["spec"]["sinks"][0], "parallelism": parallelism}]
    kube.patch("streamjobs", NAMESPACE, doc["metadata"]["name"], {"spec": {"sinks": sinks}})


def _set_stage_parallelism(kube, doc: dict, parallelism: int) -> None:
    stages = [{**doc["spec"]["stages"][0], "parallelism": parallelism}]
    kube.patch("streamjobs", NAMESPACE, doc["metadata"]["name"], {"spec": {"stages": stages}})


def test_a_window_stage_in_pods_rescales_by_a_spec_edit_with_prestaged_state_and_exact_output(
        emulator, kube, kubelet, redis_client, job, spark):
    """What users apply: a stateful Spark stage in pods. A spec edit scales it 1 -> 2: a standby StatefulSet
    for epoch 2 prestages the state of its key groups and takes over; the autoscaler's Scaler port then scales
    it 2 -> 1 the same way. The windows counted equal a Spark batch computation over the committed input."""
    doc = window_counts("elastic")
    body = job(doc)
    jobs = RedisJobStore(redis_client, job_id("elastic"))
    out = jobs.keys.output_stream("totals")
    eventually(lambda: redis_client.xlen(out) > 0, 120, "window results")
    # `kubectl get sj` columns: the source offers 150 rec/s (its first batch, after Spark's start, carries what
    # was due meanwhile, and the rate averages a window); what waits between operators is a count.
    eventually(lambda: 50 < (get(kube, "elastic").get("status", {}).get("inputRate") or 0) < 450, 60, "input rate")
    assert get(kube, "elastic")["status"]["lag"] >= 0

    seen_standbys: list[list[str]] = []

    def assigned(n: int, epoch: int) -> bool:
        for sts in _statefulsets(kube, "elastic").values():
            args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
            if "--await-epoch" in args and args not in seen_standbys:
                seen_standbys.append(args)
        a = jobs.assignment("counts")
        return a.epoch == epoch and a.parallelism == n

    _set_stage_parallelism(kube, doc, 2)  # scale out

    def handled_while_rescaling() -> bool:
        """kopf recorded the edit as handled while the controller's rescale is still under way: the update
        handler accepted it and returned; the rescaler daemon does the long work."""
        annotations = get(kube, "elastic")["metadata"].get("annotations") or {}
        handled = json.loads(annotations.get("streamjobs.dev/last-handled-configuration") or "{}")
        return (handled.get("spec", {}).get("stages", [{}])[0].get("parallelism") == 2
                and jobs.rescale_state() is not None)

    eventually(handled_while_rescaling, 120, "the edit handled while its rescale runs")
    eventually(lambda: assigned(2, 2), 180, "counts at 2 instances, epoch 2")
    eventually(lambda: set(_statefulsets(kube, "elastic")) == {"elastic-words-e1", "elastic-counts-e2"}, 60,
               "the old StatefulSet deleted")
    before = redis_client.xlen(out)
    eventually(lambda: redis_client.xlen(out) > before, 60, "results after the scale-out")

    # Scale in as the autoscaler does, through its Scaler port: an edit of the spec, then the record.
    scaler = SpecScaler(kube, Owner.of(body), redis_client, timeout_s=180)
    scaler.rescale("counts", 1)
    record = jobs.rescale_history()[-1]
    assert (record.from_parallelism, record.to_parallelism, record.epoch) == (2, 1, 3)
    assert get(kube, "elastic")["spec"]["stages"][0]["parallelism"] == 1
    assert scaler.parallelism() == {"words": 1, "counts": 1} and assigned(1, 3)
    decisions = StatusDecisionLog(kube, Owner.of(body), size=2)
    for n in range(3):
        decisions.append({"summary": f"decision {n}"})
    assert [d["summary"] for d in decisions.entries()] == ["decision 1", "decision 2"]
    assert get(kube, "elastic")["status"]["lastDecision"] == "decision 2"
    eventually(lambda: set(_statefulsets(kube, "elastic")) == {"elastic-words-e1", "elastic-counts-e3"}, 60,
               "the old StatefulSet deleted")
    wanted = {"desiredParallelism": 1, "currentParallelism": 1, "assignedParallelism": 1, "assignmentEpoch": 3}
    eventually(lambda: get(kube, "elastic")["status"]["operators"]["counts"] == wanted, 30, "status of counts")
    assert get(kube, "elastic")["status"]["operators"]["totals"]["assignedParallelism"] == 1  # chained to counts
    assert get(kube, "elastic")["status"]["lastRescale"]["to"] == 1
    assert not get(kube, "elastic")["status"].get("rescaleInProgress")
    assert ["--job", job_id("elastic"), "--operator", "counts", "--await-epoch", "2"] in seen_standbys
    # Pods were added and removed, never deleted and recreated: each pod name started exactly once.
    pods = [p for p in kubelet.started if p.startswith("elastic-counts-")]
    assert sorted(pods) == sorted({*pods}) == [
        "elastic-counts-e1-0", "elastic-counts-e2-0", "elastic-counts-e2-1", "elastic-counts-e3-0"]
    rescaled = eventually(lambda: [json.loads(e["message"]) for e in events(emulator, "elastic")
                                   if e["reason"] == "Rescaled"], 30, "Rescaled events")
    assert sorted((r["from"], r["to"]) for r in rescaled) == [(1, 2), (2, 1)]

    jobs.request_stop()  # the sources send the end-of-stream watermark: every window fires, then the sinks finish
    eventually(lambda: redis_client.scard(jobs.keys.done("totals")) >= 1, 90, "the sink drained")
    plan = jobs.plan()
    verdict = oracle.verify(spark, Ports.over_redis(redis_client, plan.id), plan)
    assert (verdict["correct"], verdict["lost"], verdict["duplicated"]) == (True, 0, 0), verdict
    assert verdict["sinks"]["totals"]["expected"] > 100  # windows of several seconds of input


def test_a_fluid_rescale_scales_the_statefulset_and_moves_key_groups_while_every_pod_runs(
        emulator, kube, kubelet, redis_client, job):
    """spec.rescale.strategy fluid: no standby StatefulSet; the current one gains pods that take key groups
    over one per step at markers, and on the way back loses the pods it emptied."""
    doc = wordcopy("fluid", sink_parallelism=1, rescale={"strategy": "fluid"})
    job(doc)
    keys = JobKeys(job_id("fluid"))
    out = keys.output_stream("copies")
    eventually(lambda: redis_client.xlen(out) > 0, 90, "sink output")

    def assigned(n: int, epoch: int) -> bool:
        a = RedisJobStore(redis_client, job_id("fluid")).assignment("copies")
        return a.epoch == epoch and a.parallelism == n

    _set_sink_parallelism(kube, doc, 3)
    eventually(lambda: assigned(3, 2), 120, "copies at 3 instances, epoch 2")
    last = eventually(lambda: get(kube, "fluid")["status"].get("lastRescale"), 30, "the rescale's record")
    assert (last["strategy"], last["moved_key_groups"], last["steps"]) == ("fluid", 8, 8)
    assert _statefulsets(kube, "fluid")["fluid-copies-e1"]["spec"]["replicas"] == 3
    before = redis_client.xlen(out)
    eventually(lambda: redis_client.xlen(out) > before, 60, "output after the scale-out")

    # An edit of parallelism alone goes straight to the rescaler, which still refuses an invalid one (the
    # admission webhook would have; kubectl --validate=false passes it) and rescales nothing ...
    _set_sink_parallelism(kube, doc, 13)
    invalid = eventually(lambda: (s := get(kube, "fluid")["status"])["phase"] == "Invalid" and s, 60, "refused")
    assert invalid["errors"] == [{"field": "spec.sinks[0].parallelism", "message": "13 exceeds maxParallelism 12"}]
    assert assigned(3, 2)
    # ... and the next edit, valid, makes the job run again.
    _set_sink_parallelism(kube, doc, 1)
    eventually(lambda: assigned(1, 3), 120, "copies back at 1 instance, epoch 3")
    eventually(lambda: _statefulsets(kube, "fluid")["fluid-copies-e1"]["spec"]["replicas"] == 1, 60, "scaled in")
    history = eventually(lambda: len(h := get(kube, "fluid")["status"].get("rescales") or []) == 2 and h, 30,
                         "both rescales in the status's history")
    assert [(h["operator"], h["from"], h["to"], h["strategy"], h["why"]) for h in history] == \
        [("copies", 1, 3, "fluid", "spec edit"), ("copies", 3, 1, "fluid", "spec edit")]
    assert all(h["endedAt"].endswith("Z") and h["pauseMs"] >= 0 and h["durationS"] > 0 for h in history)
    assert set(_statefulsets(kube, "fluid")) == {"fluid-words-e1", "fluid-copies-e1"}
    copies = [p for p in kubelet.started if p.startswith("fluid-copies-")]
    assert sorted(copies) == ["fluid-copies-e1-0", "fluid-copies-e1-1", "fluid-copies-e1-2"]
    assert_exact_after_stop(redis_client, "fluid", sink_instances=1, at_least=500)
