"""The pure parts of the operator: manifest builders, allowed spec changes, the status summary."""

from __future__ import annotations

import pytest
from streamjobs_core.control import RescaleRecord, Strategy
from streamjobs_core.loading import parse_job
from streamjobs_operator import resources
from streamjobs_operator.autoscaling import KopfEvents, parallelism_patch
from streamjobs_operator.config import Settings
from streamjobs_operator.reconcile import UnsupportedChange, check_change, job_of, parallelism_only
from streamjobs_operator.status import (
    RATE_WINDOW_S,
    conditions,
    flow_readings,
    input_rate,
    operators_status,
    parallelism_summary,
    rescale_history,
)
from streamjobs_operator.store import NoRedis, redis_target

from .jobs import wordcopy

OWNER = resources.Owner("wordcount", "jobs", "uid-1")


def test_a_standby_statefulset_waits_for_its_epoch_and_takes_its_instance_from_the_pod_index():
    sts = resources.statefulset(OWNER, "count", 4, 3, standby=True, redis=resources.RedisTarget("redis://r:6379"),
                                settings=Settings())
    assert sts["metadata"]["name"] == "wordcount-count-e4"
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == "wordcount-count"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "streamjobs_worker"]
    assert container["args"] == ["--job", "jobs/wordcount", "--operator", "count", "--await-epoch", "4"]  # its keys: per namespace
    env = {e["name"]: e for e in container["env"]}
    assert env["STREAMJOBS_INSTANCE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    # Epochs are told apart by label, so the old and new StatefulSets of a rescale select disjoint pods.
    assert sts["spec"]["selector"]["matchLabels"][resources.LABEL_EPOCH] == "4"
    first = resources.statefulset(OWNER, "count", 1, 2, standby=False, redis=resources.RedisTarget("redis://r"),
                                  settings=Settings())
    assert "--await-epoch" not in first["spec"]["template"]["spec"]["containers"][0]["args"]


def test_warm_spares_are_pods_beyond_the_instances_for_live_rescales_of_chains_that_start_spark():
    from streamjobs_operator.fleet import ready_instances, spares_of
    from streamjobs_operator.reconcile import JobContext

    sts = resources.statefulset(OWNER, "count", 1, 2, standby=False, redis=resources.RedisTarget("redis://r"),
                                settings=Settings(), spares=1)
    assert sts["spec"]["replicas"] == 3 and spares_of(sts) == 1
    assert sts["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--pod-spares"
    assert ready_instances({**sts, "status": {"readyReplicas": 3}}, ready_spares=1) == 2
    assert ready_instances({**sts, "status": {"readyReplicas": 1}}, ready_spares=0) == 1
    # An instance pod down, its spare up and ready: one instance runs, not two.
    assert ready_instances({**sts, "status": {"readyReplicas": 2}}, ready_spares=1) == 1
    suspended = resources.statefulset(OWNER, "count", 1, 0, standby=False, redis=resources.RedisTarget("redis://r"),
                                      settings=Settings(), spares=1)
    assert suspended["spec"]["replicas"] == 0

    def spares(strategy: str, stage: dict) -> dict[str, int]:
        doc = wordcopy("spared", rescale={"strategy": strategy, "spareInstances": 2})
        doc["spec"]["stages"] = [{"name": "tag", "inputs": ["words"], "chain": False, **stage}]
        doc["spec"]["sinks"][0]["inputs"] = ["tag"]
        ctx = JobContext(resources.Owner.of(doc), job_of(doc), None, Settings())
        return {op: ctx.spares(op) for op in ("words", "tag", "copies")}

    sql = {"type": "sql", "query": "SELECT * FROM input"}
    assert spares("batched", sql) == {"words": 0, "tag": 2, "copies": 0}  # only a chain that starts Spark
    assert spares("fluid", sql)["tag"] == 2
    assert spares("all_at_once", sql)["tag"] == 0  # its standbys are a StatefulSet of their own
    assert spares("restart", sql)["tag"] == 0


def test_the_redis_password_comes_from_the_secret_in_a_variable_of_its_own_never_in_the_url():
    target = resources.RedisTarget("redis://redis:6379/0", password_secret="auth")
    env = {e["name"]: e for e in resources.redis_env(target)}
    assert env["STREAMJOBS_REDIS_URL"]["value"] == "redis://redis:6379/0"
    assert env["STREAMJOBS_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "auth", "key": "password"}
    # With a user of its own, the job's workers log in as that user, with the password of its Secret.
    access = resources.JobAccess.of(OWNER)
    env = {e["name"]: e for e in resources.redis_env(target, access)}
    assert env["STREAMJOBS_REDIS_USERNAME"]["value"] == "streamjob:jobs/wordcount"
    assert env["STREAMJOBS_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "wordcount-redis-user",
                                                                              "key": "password"}
    assert env["STREAMJOBS_REDIS_URL"]["value"] == "redis://redis:6379/0"


def test_a_ca_secret_is_mounted_read_only_and_the_workers_verify_the_server_against_it():
    target = resources.RedisTarget("rediss://redis:6380/0", password_secret="auth", ca_secret="redis-ca")
    sts = resources.statefulset(OWNER, "count", 1, 2, standby=False, redis=target, settings=Settings())
    pod = sts["spec"]["template"]["spec"]
    assert {"name": "redis-ca", "secret": {"secretName": "redis-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}} \
        in pod["volumes"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "redis-ca")
    assert mount == {"name": "redis-ca", "mountPath": "/etc/streamjobs-redis-ca", "readOnly": True}
    url = next(e["value"] for e in pod["containers"][0]["env"] if e["name"] == "STREAMJOBS_REDIS_URL")
    assert url == "rediss://redis:6380/0?ssl_ca_certs=/etc/streamjobs-redis-ca/ca.crt&ssl_cert_reqs=required"
    # Without a CA secret nothing is mounted and the URL is the spec's.
    plain = resources.statefulset(OWNER, "count", 1, 2, standby=False, redis=resources.RedisTarget("redis://r"),
                                  settings=Settings())["spec"]["template"]["spec"]
    assert all(v["name"] != "redis-ca" for v in plain["volumes"])


def test_the_finalizer_reaches_redis_through_the_annotation_with_its_secrets():
    target = resources.RedisTarget("rediss://r:6380", password_secret="auth", ca_secret="ca")
    assert resources.RedisTarget.from_annotation(target.annotation()) == target
    # Annotations written before caSecret existed still read.
    assert resources.RedisTarget.from_annotation('{"url": "redis://r", "passwordSecret": null}') == \
        resources.RedisTarget("redis://r")


def test_long_names_are_shortened_to_valid_lengths_and_stay_distinct():
    job, op = "j" * 40, "o" * 40
    names = {resources.statefulset_name(job, op, e) for e in (1, 2)}
    assert len(names) == 2 and all(len(n) <= 52 for n in names)
    assert len(resources.service_name(job, op)) <= 63


def test_an_edit_that_cannot_change_the_running_job_is_refused_naming_the_field():
    old = job_of(wordcopy("j"))
    assert [c.path for c in check_change(old, job_of(wordcopy("j", sink_parallelism=3, suspend=True))).rescales] == [
        "spec.sinks[copies].parallelism"]
    assert check_change(old, job_of(wordcopy("j", sink_cost_us=5.0))).live
    changed = wordcopy("j")
    changed["spec"]["sources"] = [{**changed["spec"]["sources"][0], "vocabulary": 7}]
    with pytest.raises(UnsupportedChange, match=r"^spec\.sources\[words\]\.vocabulary: refused \(a source's"):
        check_change(old, job_of(changed))
    with pytest.raises(UnsupportedChange, match=r"resume it first"):
        check_change(old, job_of(wordcopy("j", sink_cost_us=5.0, suspend=True)))


def test_an_edit_of_parallelism_alone_goes_to_the_rescaler_and_any_other_edit_to_the_update_handler():
    spec = wordcopy("j")["spec"]
    assert parallelism_only(spec, wordcopy("j", sink_parallelism=3)["spec"])
    assert not parallelism_only(spec, spec) and not parallelism_only(None, spec)
    assert not parallelism_only(spec, wordcopy("j", sink_parallelism=3, suspend=True)["spec"])
    assert not parallelism_only(spec, wordcopy("j", sink_parallelism=3, sink_cost_us=5.0)["spec"])
    renamed = {**spec, "sinks": [{**spec["sinks"][0], "name": "other", "parallelism": 3}]}
    assert not parallelism_only(spec, renamed)


def test_the_redis_url_comes_from_the_spec_or_the_operator_default():
    job = parse_job(wordcopy("j"))
    assert redis_target(job, Settings(default_redis_url="redis://d:6379")).url == "redis://d:6379"
    with pytest.raises(NoRedis, match=r"^spec\.redis\.url"):
        redis_target(job, Settings())
    clustered = parse_job(wordcopy("j", redis={"url": "redis://c:7000", "cluster": True}))
    assert redis_target(clustered, Settings()).url == "redis://c:7000?cluster=1"


def test_status_summary_shows_current_over_desired_while_they_differ():
    ops = operators_status({"words": 1, "count": 3}, {"words": (1, 1), "count": (2, 2)}, {"words": 1, "count": 2})
    assert ops["count"] == {"desiredParallelism": 3, "currentParallelism": 2, "assignedParallelism": 2,
                            "assignmentEpoch": 2}
    assert parallelism_summary(ops) == "words=1 count=2/3"


def test_an_autoscaler_decision_patches_the_right_operator_and_becomes_an_event():
    job = job_of(wordcopy("j", sink_parallelism=2))
    assert parallelism_patch(job, "copies", 4) == [
        {"op": "test", "path": "/spec/sinks/0/name", "value": "copies"},
        {"op": "add", "path": "/spec/sinks/0/parallelism", "value": 4}]  # also where the spec left it out
    with pytest.raises(KeyError):
        parallelism_patch(job, "nope", 1)
    posted = []
    KopfEvents({"metadata": {"name": "j"}}, post=lambda body, **kw: posted.append(kw)).emit(
        "ScaleUp", "count 2 -> 4: true rate 900/s per instance", warning=False)
    assert posted == [{"type": "Normal", "reason": "ScaleUp", "message": "count 2 -> 4: true rate 900/s per instance"}]


def test_conditions_follow_the_phase_and_keep_their_transition_time_until_their_status_flips():
    def by_type(found):
        return {c["type"]: (c["status"], c["reason"], c["lastTransitionTime"]) for c in found}

    deploying = conditions(None, "Deploying", "waiting for 2 pods", None, "t0")
    assert by_type(deploying) == {"Ready": ("False", "Deploying", "t0"), "Scaling": ("False", "Steady", "t0"),
                                  "Reconfiguring": ("False", "Steady", "t0"), "Degraded": ("False", "AsWritten", "t0")}
    assert deploying[0]["message"] == "waiting for 2 pods"
    running = conditions(deploying, "Running", None, None, "t1")
    assert by_type(running)["Ready"] == ("True", "Running", "t1") and by_type(running)["Scaling"][2] == "t0"
    rescaling = conditions(running, "Rescaling", "rescaling count from 2 to 3", None, "t2")
    assert by_type(rescaling)["Ready"] == ("True", "Rescaling", "t1"), "a live rescale keeps the job running"
    assert by_type(rescaling)["Scaling"] == ("True", "Rescaling", "t2")
    assert [c["message"] for c in rescaling if c["type"] == "Scaling"] == ["rescaling count from 2 to 3"]
    failed = conditions(conditions(rescaling, "Running", None, None, "t3"), "Failed", "words/0: tag: Spark refuses",
                        "PARSE_SYNTAX_ERROR", "t4")
    assert by_type(failed) == {"Ready": ("False", "Failed", "t4"), "Scaling": ("False", "Steady", "t3"),
                               "Reconfiguring": ("False", "Steady", "t0"), "Degraded": ("True", "JobFailed", "t4")}
    assert [c["message"] for c in failed if c["type"] == "Degraded"] == ["PARSE_SYNTAX_ERROR"]


def test_a_rescale_in_the_history_names_the_decision_that_asked_for_it_or_the_spec():
    def record(to: int, ended: float) -> RescaleRecord:
        return RescaleRecord("count", 1, to, Strategy("batched"), 2, 312.4, 4.5, 64, 2, ended_at=ended)

    decisions = [{"executed": True, "operators": [{"operator": "count", "parallelism": 2, "why": "old"}]},
                 {"executed": False, "operators": [{"operator": "count", "parallelism": 2, "why": "not done"}]},
                 {"executed": True, "operators": [{"operator": "words", "parallelism": 2, "why": "other op"},
                                                  {"operator": "count", "parallelism": 2, "why": "count 1 -> 2 [ds2]"}]}]
    history = rescale_history([record(2, 0.0), record(3, 1764307260.5)], decisions)
    assert [h["why"] for h in history] == ["count 1 -> 2 [ds2]", "spec edit"]
    assert history[1] == {"endedAt": "2025-11-28T05:21:00Z", "operator": "count", "from": 1, "to": 3,
                          "strategy": "batched", "pauseMs": 312, "durationS": 4.5, "movedKeyGroups": 64,
                          "rolledBack": False, "why": "spec edit"}


def test_input_rate_averages_the_last_window_of_readings_of_counters_that_only_grow():
    assert input_rate(flow_readings((), (10.0, 500))) is None
    assert input_rate(flow_readings(((10.0, 500),), (12.0, 800))) == 150.0
    # A batch of 700 between two readings 1 s apart is not a rate of 700: the window averages it out.
    readings = ()
    for t, n in [(0.0, 0), (1.0, 150), (2.0, 150), (3.0, 150), (4.0, 850), (5.0, 1000), (6.0, 1000)]:
        readings = flow_readings(readings, (t, n))
    assert input_rate(readings) == round(1000 / 6, 1)
    # Readings older than the window go.
    later = flow_readings(readings, (6.0 + RATE_WINDOW_S, 1000 + 150 * RATE_WINDOW_S))
    assert later[0] == (6.0, 1000) and input_rate(later) == 150.0
    # The job was redeployed: its counters began again, and only the new reading is left.
    assert flow_readings(readings, (7.0, 20)) == ((7.0, 20),) and input_rate(flow_readings(readings, (7.0, 20))) is None


def test_metrics_listen_on_the_pods_ip_unless_the_chart_says_otherwise():
    def metrics_host(settings: Settings) -> dict:
        sts = resources.statefulset(OWNER, "count", 1, 1, standby=False, redis=resources.RedisTarget("redis://r"),
                                    settings=settings)
        return next(e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]
                    if e["name"] == "STREAMJOBS_METRICS_HOST")

    assert metrics_host(Settings())["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert metrics_host(Settings.from_env({"STREAMJOBS_WORKER_METRICS_HOST": "0.0.0.0"}))["value"] == "0.0.0.0"
