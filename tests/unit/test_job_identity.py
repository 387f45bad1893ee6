"""A job's identity in Redis: its namespace and name, so jobs of one name in two namespaces share no key."""

from __future__ import annotations

import pytest
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.layout import JobKeys, job_id, namespace_of
from streamjobs_core.loading import SpecError, parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.reconfigure import ReconfigureController


def _job(namespace: str | None = None, query: str = "SELECT * FROM input"):
    metadata = {"name": "wordcount"} if namespace is None else {"name": "wordcount", "namespace": namespace}
    return parse_job({"apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": metadata, "spec": {
        "sources": [{"name": "words", "type": "zipf"}],
        "stages": [{"name": "tag", "type": "sql", "inputs": ["words"], "query": query}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["tag"]}]}})


def test_jobs_of_one_name_in_two_namespaces_have_disjoint_keys_each_under_one_hash_tag():
    a, b = JobPlan(_job("tenant-a"), 0).keys, JobPlan(_job("tenant-b"), 0).keys
    every = [lambda k: k.plan, lambda k: k.deployed_by, lambda k: k.input_stream("words", 0),
             lambda k: k.output_stream("out"), lambda k: k.kg_stream("words", "tag", 3), lambda k: k.snapshot("tag", 3)]
    assert not {f(a) for f in every} & {f(b) for f in every}
    for keys, tag in ((a, "{tenant-a/wordcount}"), (b, "{tenant-b/wordcount}")):
        assert all(f(keys).split(":")[1] == tag for f in every)  # one Redis Cluster slot per job
        assert b.pattern.replace("*", "") not in a.plan  # one job's SCAN pattern never matches the other's keys


def test_the_local_runtime_keeps_keys_by_name_and_an_id_says_its_namespace():
    assert JobPlan(_job(), 0).keys == JobKeys("wordcount")
    assert JobPlan(_job(), 0).keys.input_stream("words", 0) == "sj:{wordcount}:in:words:0"
    assert (namespace_of(job_id("jobs", "wordcount")), namespace_of("wordcount")) == ("jobs", None)


@pytest.mark.parametrize("namespace", ["Tenant", "a/b", "x" * 64, "-a", "a.b"])
def test_a_namespace_that_is_not_a_dns_label_is_refused_naming_the_field(namespace):
    with pytest.raises(SpecError) as raised:
        _job(namespace)
    assert raised.value.errors[0][0] == "metadata.namespace"


def test_a_plan_placed_under_another_job_id_runs_on_that_jobs_keys():
    plan = JobPlan(_job("tenant-a"), 0)
    moved = plan.placed("tenant-b/wordcount")
    assert moved.keys == JobKeys("tenant-b/wordcount") and moved.job.spec == plan.job.spec
    assert plan.placed("wordcount").keys == JobKeys("wordcount")
    assert plan.placed(plan.id) is plan


def test_a_reconfiguration_keeps_the_running_jobs_identity_whatever_the_edit_says():
    store = MemoryJobStore()
    store.deploy(JobPlan(_job("tenant-a"), 0))
    controller = ReconfigureController(store, sleep=lambda _: [
        store.record_versions(None, op, range(store.plan().key_groups(op)), 1) for op in store.plan().vertices])
    controller.apply(_job(None, "SELECT word, event_time FROM input"))
    assert store.plan().version == 1 and store.plan().id == "tenant-a/wordcount"
