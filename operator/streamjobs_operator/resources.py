"""Pure builders of the Kubernetes objects of a StreamJob: dicts in, dicts out, no I/O.

Per operator of a job: one headless Service (stable pod DNS names for the
whole operator), and one StatefulSet per assignment epoch the operator went
through, `<job>-<op>-e<epoch>`. A live rescale creates the next epoch's
StatefulSet beside the current one (its pods wait as standbys), scales the old
one to zero once they are warm, then deletes it: pods are never deleted and
recreated to change the parallelism.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from streamjobs_core.connect import PASSWORD_ENV, USERNAME_ENV
from streamjobs_core.layout import job_id
from streamjobs_core.spec import API_VERSION, KIND

from .config import Settings

LABEL_JOB = "streamjobs.dev/job"
LABEL_OPERATOR = "streamjobs.dev/operator"
LABEL_EPOCH = "streamjobs.dev/epoch"
# On a StatefulSet: how many of its replicas beyond the operator's instances wait as warm spares (spares.py).
SPARES_ANNOTATION = "streamjobs.dev/spares"
# Set by the StatefulSet controller on every pod (Kubernetes >= 1.28): the pod's ordinal = the worker's instance.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
METRICS_PORT = 9100
PASSWORD_KEY = "password"
CA_MOUNT, CA_KEY = "/etc/streamjobs-redis-ca", "ca.crt"
# A StatefulSet's pods carry `controller-revision-hash: <name>-<10 chars>`, a label value of at most 63.
_STATEFULSET_NAME_MAX = 52


@dataclass(frozen=True)
class Owner:
    """The StreamJob object every built object belongs to."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, body) -> Owner:
        meta = body["metadata"]
        return cls(meta["name"], meta.get("namespace") or "default", meta.get("uid", ""))

    @property
    def job(self) -> str:
        """The job id its Redis keys derive from (layout.job_id): `<namespace>/<name>`."""
        return job_id(self.namespace, self.name)

    def reference(self) -> dict:
        # controller=True: `kubectl get` shows the job as the controller; the GC deletes what a job owns.
        return {"apiVersion": API_VERSION, "kind": KIND, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}


@dataclass(frozen=True)
class JobAccess:
    """The job's own Redis user (access.py) and the Secret, in the job's namespace, holding its password."""

    username: str
    secret: str

    @classmethod
    def of(cls, owner: Owner) -> JobAccess:
        return cls(f"streamjob:{owner.job}", _fit(f"{owner.name}-redis-user", 253))


@dataclass(frozen=True)
class RedisTarget:
    url: str
    password_secret: str | None = None
    ca_secret: str | None = None
    default: bool = False  # the operator's default Redis, which it logs in to with its own password (config.py)

    def annotation(self) -> str:
        """What the finalizer needs to reach the job's Redis after the spec changed or went invalid."""
        return json.dumps({"url": self.url, "passwordSecret": self.password_secret, "caSecret": self.ca_secret,
                           "default": self.default})

    @classmethod
    def from_annotation(cls, raw: str) -> RedisTarget:
        data = json.loads(raw)
        return cls(data["url"], data.get("passwordSecret"), data.get("caSecret"), bool(data.get("default")))


def _fit(name: str, limit: int) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def statefulset_name(job: str, op: str, epoch: int) -> str:
    return _fit(f"{job}-{op}-e{epoch}", _STATEFULSET_NAME_MAX)


def service_name(job: str, op: str) -> str:
    return _fit(f"{job}-{op}", 63)


def configmap_name(job: str) -> str:
    return _fit(f"{job}-plan", 253)


def labels(job: str, op: str | None = None, epoch: int | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "streamjobs-worker", "app.kubernetes.io/managed-by": "streamjobs-operator",
           LABEL_JOB: job}
    if op is not None:
        out[LABEL_OPERATOR] = op
    if epoch is not None:
        out[LABEL_EPOCH] = str(epoch)
    return out


def _metadata(owner: Owner, name: str, object_labels: dict[str, str]) -> dict:
    return {"name": name, "namespace": owner.namespace, "labels": object_labels,
            "ownerReferences": [owner.reference()]}


def with_ca(url: str, ca_file: str) -> str:
    """The URL verifying the server's certificate against the CA in `ca_file`."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(ssl_ca_certs=ca_file, ssl_cert_reqs="required")
    return urlunsplit(parts._replace(query=urlencode(query, safe="/")))


def redis_env(redis: RedisTarget, access: JobAccess | None = None) -> list[dict]:
    """The URL, and the credentials apart from it (connect.py): the job's own user, if it has one, else the
    password of spec.redis.passwordSecret. Secret references: no password is in the pod spec."""
    url = redis.url if redis.ca_secret is None else with_ca(redis.url, f"{CA_MOUNT}/{CA_KEY}")
    env = [{"name": "STREAMJOBS_REDIS_URL", "value": url}]
    if access is not None:
        env += [{"name": USERNAME_ENV, "value": access.username},
                {"name": PASSWORD_ENV, "valueFrom": {"secretKeyRef": {"name": access.secret, "key": PASSWORD_KEY}}}]
    elif redis.password_secret is not None:
        env.append({"name": PASSWORD_ENV, "valueFrom": {"secretKeyRef": {"name": redis.password_secret,
                                                                         "key": PASSWORD_KEY}}})
    return env


def credentials_secret(owner: Owner, access: JobAccess, password: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(owner, access.secret, labels(owner.name)),
            "data": {PASSWORD_KEY: base64.b64encode(password.encode()).decode()}}


def worker_args(job: str, op: str, await_epoch: int | None, pod_spares: bool = False) -> list[str]:
    args = ["--job", job, "--operator", op]
    if await_epoch is not None:
        args += ["--await-epoch", str(await_epoch)]
    if pod_spares:
        args.append("--pod-spares")
    return args


def statefulset(owner: Owner, op: str, epoch: int, replicas: int, *, standby: bool, redis: RedisTarget,
                settings: Settings, access: JobAccess | None = None, spares: int = 0) -> dict:
    """The pods of one operator for one assignment epoch; `standby` pods wait for that epoch to be assigned.
    `replicas` instances, and `spares` pods beyond them that wait as warm spares (none for standbys)."""
    pod_labels = labels(owner.name, op, epoch)
    env = [
        {"name": "STREAMJOBS_INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}},
        *redis_env(redis, access),
        {"name": "STREAMJOBS_METRICS_HOST", "value": settings.worker_metrics_host} if settings.worker_metrics_host
        else {"name": "STREAMJOBS_METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "STREAMJOBS_METRICS_PORT", "value": str(METRICS_PORT)},
        {"name": "STREAMJOBS_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        # Spark and Ivy write under $HOME; the root filesystem is read-only.
        {"name": "HOME", "value": "/tmp"},
    ]
    container = {
        "name": "worker",
        "image": settings.worker_image,
        "imagePullPolicy": settings.worker_image_pull_policy,
        "command": ["python", "-m", "streamjobs_worker"],
        "args": worker_args(owner.job, op, epoch if standby else None, pod_spares=spares > 0),
        "env": env,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        "resources": settings.worker_resources,
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "plan", "mountPath": "/etc/streamjobs"}],
    }
    if redis.ca_secret is not None:
        container["volumeMounts"].append({"name": "redis-ca", "mountPath": CA_MOUNT, "readOnly": True})
    pod_spec = {
        "containers": [container],
        # A worker stops after its last commit on SIGTERM; a batch takes about a second.
        "terminationGracePeriodSeconds": 30,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "tmp", "emptyDir": {}},
                    {"name": "plan", "configMap": {"name": configmap_name(owner.name)}}],
    }
    if redis.ca_secret is not None:
        pod_spec["volumes"].append({"name": "redis-ca", "secret": {
            "secretName": redis.ca_secret, "items": [{"key": CA_KEY, "path": CA_KEY}]}})
    if settings.worker_service_account:
        pod_spec["serviceAccountName"] = settings.worker_service_account
    pod_spec["automountServiceAccountToken"] = False
    metadata = _metadata(owner, statefulset_name(owner.name, op, epoch), pod_labels)
    if spares:
        metadata["annotations"] = {SPARES_ANNOTATION: str(spares)}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas + spares if replicas else 0,
            "serviceName": service_name(owner.name, op),
            # Instances do not depend on each other's start: start and stop them all at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": pod_labels},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }


def service(owner: Owner, op: str) -> dict:
    """Headless, across the operator's epochs: stable DNS for its pods and a target for Prometheus."""
    selector = {LABEL_JOB: owner.name, LABEL_OPERATOR: op}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, service_name(owner.name, op), labels(owner.name, op)),
        "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": True,
                 "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]},
    }


def configmap(owner: Owner, plan_json: str) -> dict:
    """The plan as deployed, for humans and tools: workers read it from Redis, where it is fenced."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, configmap_name(owner.name), labels(owner.name)),
        "data": {"plan.json": plan_json},
    }
