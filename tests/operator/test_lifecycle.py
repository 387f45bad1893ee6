"""A StreamJob's life under the operator: deploy, invalid spec, suspend, delete (finalizer)."""

from __future__ import annotations

import json

from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import JobKeys
from streamjobs_operator.resources import LABEL_JOB

from .conftest import NAMESPACE, await_deleted, events, eventually, run_kubectl
from .jobs import apply, get, job_id, phase, tagged_words, wordcopy


def _owned(kube, kind: str, job: str) -> list[dict]:
    return kube.list(kind, NAMESPACE, {LABEL_JOB: job})


def test_invalid_spec_names_the_field_in_status_and_event_and_touches_nothing(emulator, kube, operator, redis_client):
    doc = wordcopy("broken")
    doc["spec"]["sinks"][0]["inputs"] = ["nope"]
    apply(kube, doc)

    eventually(lambda: phase(kube, "broken") == "Invalid", 30, "phase Invalid")
    status = get(kube, "broken")["status"]
    assert "spec.sinks[0].inputs[0]" in status["error"] and "nope" in status["error"]
    assert status["errors"][0]["field"] == "spec.sinks[0].inputs[0]"
    degraded = [c for c in status["conditions"] if c["type"] == "Degraded"][0]
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec") and "nope" in degraded["message"]
    warnings = eventually(lambda: [e for e in events(emulator, "broken") if e["reason"] == "InvalidSpec"], 30, "event")
    assert warnings[0]["type"] == "Warning" and "spec.sinks[0].inputs[0]" in warnings[0]["message"]
    for kind in ("statefulsets", "services", "configmaps"):
        assert _owned(kube, kind, "broken") == []
    assert list(redis_client.scan_iter(match=JobKeys(job_id("broken")).pattern)) == []
    kube.delete("streamjobs", NAMESPACE, "broken")  # the finalizer has nothing to clean: it must not block
    eventually(lambda: kube.get("streamjobs", NAMESPACE, "broken") is None, 30, "invalid job deleted")


def test_deploy_creates_owned_objects_and_the_plan_in_redis(emulator, kube, job, redis_client):
    uid = job(wordcopy("deployed", sink_parallelism=2, rescale={"spareInstances": 1}), kubectl=True)["metadata"]["uid"]
    ignored = eventually(lambda: [e for e in events(emulator, "deployed") if e["reason"] == "Ignored"], 30, "event")
    assert ignored[0]["type"] == "Warning" and "spec.rescale.spareInstances" in ignored[0]["message"]
    assert "deployed" in run_kubectl(emulator, "get", "sj")
    assert run_kubectl(emulator, "get", "sj", "deployed", "-o", "jsonpath={.status.phase}") == "Running"
    statefulsets = {s["metadata"]["name"]: s for s in _owned(kube, "statefulsets", "deployed")}
    assert set(statefulsets) == {"deployed-words-e1", "deployed-copies-e1"}
    assert statefulsets["deployed-copies-e1"]["spec"]["replicas"] == 2
    services = {s["metadata"]["name"] for s in _owned(kube, "services", "deployed")}
    assert services == {"deployed-words", "deployed-copies"}
    (configmap,) = _owned(kube, "configmaps", "deployed")
    for obj in [*statefulsets.values(), configmap, *_owned(kube, "services", "deployed")]:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("StreamJob", "deployed", uid, True)

    keys = JobKeys(job_id("deployed"))
    plan = RedisJobStore(redis_client, job_id("deployed")).plan()
    assert json.loads(configmap["data"]["plan.json"]) == json.loads(plan.to_json())
    assert RedisJobStore(redis_client, job_id("deployed")).assignment("copies").parallelism == 2
    # Real workers run: records reach the sink.
    eventually(lambda: redis_client.xlen(keys.output_stream("copies")) > 0, 60, "sink output")
    operators = eventually(lambda: (get(kube, "deployed")["status"].get("operators") or {}).get("copies"), 30)
    assert operators["desiredParallelism"] == 2 and operators["assignmentEpoch"] == 1
    eventually(lambda: get(kube, "deployed")["status"].get("parallelismSummary") == "words=1 copies=2", 30, "summary")
    ready = {c["type"]: c for c in get(kube, "deployed")["status"]["conditions"]}
    assert (ready["Ready"]["status"], ready["Degraded"]["status"], ready["Scaling"]["status"]) == ("True", "False", "False")
    assert run_kubectl(emulator, "get", "sj", "deployed", "-o",
                       'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == "True"


def test_suspend_scales_to_zero_and_back_and_other_edits_are_refused(kube, job, redis_client):
    job(wordcopy("pausing"))
    # One running job serves both checks (each job costs its workers' start-up CPU).
    kube.patch("streamjobs", NAMESPACE, "pausing", {"spec": {"maxParallelism": 24}})
    error = eventually(lambda: get(kube, "pausing")["status"].get("error"), 30, "error in status")
    assert error.startswith("spec.maxParallelism: refused (it maps keys to other key groups")
    assert RedisJobStore(redis_client, job_id("pausing")).plan().spec.max_parallelism == 12
    kube.patch("streamjobs", NAMESPACE, "pausing", {"spec": {"maxParallelism": 12}})
    eventually(lambda: not get(kube, "pausing")["status"].get("error"), 30, "error cleared")

    kube.patch("streamjobs", NAMESPACE, "pausing", {"spec": {"suspend": True}})
    eventually(lambda: phase(kube, "pausing") == "Suspended", 60, "phase Suspended")
    assert all(s["spec"]["replicas"] == 0 for s in _owned(kube, "statefulsets", "pausing"))
    eventually(lambda: not _owned(kube, "pods", "pausing"), 60, "pods gone")
    out = JobKeys(job_id("pausing")).output_stream("copies")
    paused_at = redis_client.xlen(out)

    kube.patch("streamjobs", NAMESPACE, "pausing", {"spec": {"suspend": False}})
    eventually(lambda: phase(kube, "pausing") == "Running", 60, "phase Running again")
    assert {s["spec"]["replicas"] for s in _owned(kube, "statefulsets", "pausing")} == {1}
    eventually(lambda: redis_client.xlen(out) > paused_at, 60, "output resumes")


def test_delete_runs_the_finalizer_that_clears_redis(kube, kubelet, redis_client):
    apply(kube, wordcopy("doomed"))
    eventually(lambda: phase(kube, "doomed") == "Running", 90, "phase Running")
    assert get(kube, "doomed")["metadata"]["finalizers"] == ["streamjobs.dev/redis-keys"]
    keys = JobKeys(job_id("doomed"))
    eventually(lambda: redis_client.xlen(keys.output_stream("copies")) > 0, 60, "sink output")

    assert kube.delete("streamjobs", NAMESPACE, "doomed")
    await_deleted(kube, kubelet, "doomed", 60)
    assert list(redis_client.scan_iter(match=keys.pattern)) == []
    assert _owned(kube, "statefulsets", "doomed") == [] and _owned(kube, "pods", "doomed") == []


def test_a_query_spark_refuses_fails_the_job_naming_operator_and_cause_and_stops_its_workers(emulator, kube, kubelet,
                                                                                              redis_client):
    doc = tagged_words("misspelt")
    doc["spec"]["stages"][0]["query"] = "SELECT word,, event_time FROM input"
    apply(kube, doc)
    eventually(lambda: phase(kube, "misspelt") == "Failed", 120, "phase Failed")
    status = get(kube, "misspelt")["status"]
    assert status["message"].startswith("words/0: tag: Spark refuses its query") and "PARSE_SYNTAX_ERROR" in status["error"]
    degraded = {c["type"]: c for c in status["conditions"]}
    assert (degraded["Ready"]["status"], degraded["Degraded"]["status"], degraded["Degraded"]["reason"]) == \
        ("False", "True", "JobFailed") and "PARSE_SYNTAX_ERROR" in degraded["Degraded"]["message"]
    failed = eventually(lambda: [e for e in events(emulator, "misspelt") if e["reason"] == "JobFailed"], 30, "event")
    assert failed[0]["type"] == "Warning" and "SELECT word,, event_time" in failed[0]["message"]
    eventually(lambda: all(s["spec"]["replicas"] == 0 for s in _owned(kube, "statefulsets", "misspelt")), 30,
               "workers stopped: a restart would meet the same query")
    kube.delete("streamjobs", NAMESPACE, "misspelt")
    await_deleted(kube, kubelet, "misspelt")
