"""Operator-wide settings, each from one environment variable the helm chart sets.

Every setting is typed, defaulted and documented here, in one place (as
flink-kubernetes-operator keeps its options), so the chart, the docs and the
code cannot disagree about a name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from streamjobs_core.savepoint import Trust


@dataclass(frozen=True)
class Settings:
    # Image of the worker pods: Python, Java and Spark with `streamjobs_worker` installed.
    worker_image: str = "streamjobs/worker:0.1.0"
    worker_image_pull_policy: str = "IfNotPresent"
    # Used when a StreamJob names no spec.redis.url: the Redis the chart installs.
    default_redis_url: str | None = None
    # The operator's own login to it (the chart's bundled Redis asks for one); never given to workers.
    default_redis_password: str | None = None
    # Container resources of every worker pod (requests/limits as in a Pod spec).
    worker_resources: dict = field(default_factory=dict)
    # Where a worker's /metrics listens; empty: the pod's IP only (not every interface of the pod).
    worker_metrics_host: str = ""
    # Service account of the worker pods; they need no Kubernetes API access.
    worker_service_account: str | None = None
    # How long a rescale waits for new pods to warm up (SparkSession start ~7 s, image pull first).
    ready_timeout_s: float = 600.0
    # How often the status (current parallelism, epoch, rescale progress) is refreshed and the job's Redis is
    # checked for what `streamjobs control` and `streamjobs rebalance` asked.
    status_interval_s: float = 5.0
    # Whether a spec's SQL may call reflect(), java_method() or try_reflect() (sqlguard.py): any Java method,
    # run with the worker's rights, by whoever may create a StreamJob.
    allow_jvm_functions: bool = False
    # spec.restoreFrom: only a regular file under this directory (the chart mounts operator.savepoints there), of
    # at most this many bytes (the operator reads it whole: keep it under the pod's memory limit), and, with a
    # signing key (a Secret's, in the chart), only one signed with it (`streamjobs savepoint --signing-key-file`).
    savepoint_dir: str = "/savepoints"
    savepoint_max_bytes: int = 256 << 20
    savepoint_signing_key: bytes | None = None
    # A Redis user per job (access.py): its workers may touch its own keys only. Needs the operator's own Redis
    # connection to may run ACL SETUSER (the chart's bundled Redis: on by default).
    redis_acl: bool = False
    # Key prefixes of lookup tables (lookup.redisKeyPrefix) outside the jobs' own keys that the jobs of a
    # namespace may read, by namespace ("*": every namespace). A lookup stage naming another prefix is Invalid.
    lookup_tables: dict = field(default_factory=dict)
    # Redis URLs a spec's redis.url may name besides the default one (admission.py): the operator connects there,
    # and sends it the password of the Secret the spec names.
    redis_urls: tuple[str, ...] = ()

    def tables(self, namespace: str) -> tuple[str, ...]:
        return (*self.lookup_tables.get("*", ()), *self.lookup_tables.get(namespace, ()))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        defaults = cls()
        return cls(
            worker_image=env.get("STREAMJOBS_WORKER_IMAGE", defaults.worker_image),
            worker_image_pull_policy=env.get("STREAMJOBS_WORKER_IMAGE_PULL_POLICY", defaults.worker_image_pull_policy),
            default_redis_url=env.get("STREAMJOBS_DEFAULT_REDIS_URL") or None,
            default_redis_password=env.get("STREAMJOBS_DEFAULT_REDIS_PASSWORD") or None,
            worker_resources=json.loads(env.get("STREAMJOBS_WORKER_RESOURCES") or "{}"),
            worker_service_account=env.get("STREAMJOBS_WORKER_SERVICE_ACCOUNT") or None,
            worker_metrics_host=env.get("STREAMJOBS_WORKER_METRICS_HOST", ""),
            ready_timeout_s=float(env.get("STREAMJOBS_READY_TIMEOUT_S", defaults.ready_timeout_s)),
            status_interval_s=float(env.get("STREAMJOBS_STATUS_INTERVAL_S", defaults.status_interval_s)),
            allow_jvm_functions=_flag(env.get("STREAMJOBS_ALLOW_JVM_FUNCTIONS")),
            savepoint_dir=env.get("STREAMJOBS_SAVEPOINT_DIR", defaults.savepoint_dir),
            savepoint_max_bytes=int(env.get("STREAMJOBS_SAVEPOINT_MAX_BYTES", defaults.savepoint_max_bytes)),
            savepoint_signing_key=env.get("STREAMJOBS_SAVEPOINT_SIGNING_KEY", "").encode() or None,
            redis_acl=_flag(env.get("STREAMJOBS_REDIS_ACL")),
            lookup_tables=json.loads(env.get("STREAMJOBS_LOOKUP_TABLES") or "{}"),
            redis_urls=tuple(u.strip() for u in (env.get("STREAMJOBS_REDIS_URLS") or "").split(",") if u.strip()),
        )

    @property
    def savepoint_trust(self) -> Trust:
        return Trust(self.savepoint_max_bytes, Path(self.savepoint_dir), self.savepoint_signing_key)


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")
