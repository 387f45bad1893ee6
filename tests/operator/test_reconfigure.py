"""A spec edit the running job can take live: `kubectl apply` of a changed query, applied at a consistent cut
without a pod restarted, with an Event per change and the output checked per record by the oracle."""

from __future__ import annotations

import json
from collections import Counter

import yaml
from streamjobs import oracle
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_worker.ports import Ports

from .conftest import NAMESPACE, events, eventually, run_kubectl
from .jobs import get, job_id, tagged_words


def test_a_query_edited_by_kubectl_apply_changes_live_with_events_and_exact_output(
        emulator, kube, kubelet, redis_client, job, spark, tmp_path):
    job(tagged_words("retagged"), kubectl=True)
    jobs = RedisJobStore(redis_client, job_id("retagged"))
    out = jobs.keys.output_stream("copies")
    eventually(lambda: redis_client.xlen(out) > 300, 120, "copies before the edit")
    pods = list(kubelet.started)

    edited = tmp_path / "retagged-v1.yaml"
    edited.write_text(yaml.safe_dump(tagged_words("retagged", tag="v1")))
    run_kubectl(emulator, "apply", "--validate=false", "-f", str(edited))
    done = eventually(lambda: [json.loads(e["message"]) for e in events(emulator, "retagged")
                               if e["reason"] == "Reconfigured"], 120, "a Reconfigured event")
    assert done[0]["version"] == 1 and done[0]["changes"] == ["spec.stages[tag].query: live"]
    started = [json.loads(e["message"]) for e in events(emulator, "retagged") if e["reason"] == "ReconfigureStarted"]
    assert started == [{"field": "spec.stages[tag].query", "operator": "tag"}]
    assert get(kube, "retagged")["status"]["lastReconfiguration"]["version"] == 1
    eventually(lambda: get(kube, "retagged")["status"].get("phase") == "Running", 30, "Running again")
    assert jobs.plan().spec.operator("tag").query.endswith("'v1' AS tag FROM input")
    assert kubelet.started == pods  # live: no pod was started (or restarted) for it

    before = redis_client.xlen(out)
    eventually(lambda: redis_client.xlen(out) > before + 300, 60, "copies after the edit")

    # A sink on workers of its own comes (its StatefulSet and Service created before the sources switch), then goes.
    more = tagged_words("retagged", tag="v1")
    more["spec"]["sinks"].append({"name": "more", "type": "redis_stream", "inputs": ["tag"], "chain": False})
    extra = jobs.keys.output_stream("more")
    for version, doc in ((2, more), (3, tagged_words("retagged", tag="v1"))):
        edited.write_text(yaml.safe_dump(doc))
        run_kubectl(emulator, "apply", "--validate=false", "-f", str(edited))
        eventually(lambda version=version: [e for e in events(emulator, "retagged") if e["reason"] == "Reconfigured"
                                            and json.loads(e["message"])["version"] == version], 120,
                   f"version {version}")
        if version == 2:
            assert "retagged-more-e1-0" in kubelet.started and kube.get("services", NAMESPACE, "retagged-more")
            eventually(lambda: redis_client.xlen(extra) > 300, 60, "the added sink's output")
    assert not [name for _, name in kubelet.pods if name.startswith("retagged-more")] and not kube.get(
        "services", NAMESPACE, "retagged-more")
    assert set(jobs.versions("more").values()) == {3} and redis_client.xlen(extra) > 300
    jobs.request_stop()
    eventually(lambda: redis_client.scard(jobs.keys.done("copies")) >= 1, 90, "the sink drained")
    plan = jobs.plan()
    verdict = oracle.verify(spark, Ports.over_redis(redis_client, plan.id), plan)
    assert (verdict["correct"], verdict["lost"], verdict["duplicated"]) == (True, 0, 0), verdict
    tags = Counter(fields[b"tag"] for _, fields in redis_client.xrange(out))
    assert tags[b"v0"] > 300 and tags[b"v1"] > 300, tags
