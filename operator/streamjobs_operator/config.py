"""Operator-wide settings, each from one environment variable the helm chart sets.

Every setting is typed, defaulted and documented here, in one place (as
flink-kubernetes-operator keeps its options), so the chart, the docs and the
code cannot disagree about a name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Settings:
    # Image of the worker pods: Python, Java and Spark with `streamjobs_worker` installed.
    worker_image: str = "streamjobs/worker:0.1.0"
    worker_image_pull_policy: str = "IfNotPresent"
    # Used when a StreamJob names no spec.redis.url: the Redis the chart installs.
    default_redis_url: str | None = None
    # Container resources of every worker pod (requests/limits as in a Pod spec).
    worker_resources: dict = field(default_factory=dict)
    # Service account of the worker pods; they need no Kubernetes API access.
    worker_service_account: str | None = None
    # How long a rescale waits for new pods to warm up (SparkSession start ~7 s, image pull first).
    ready_timeout_s: float = 600.0
    # How often the status (current parallelism, epoch, rescale progress) is refreshed and the job's Redis is
    # checked for what `streamjobs control` and `streamjobs rebalance` asked.
    status_interval_s: float = 5.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        defaults = cls()
        return cls(
            worker_image=env.get("STREAMJOBS_WORKER_IMAGE", defaults.worker_image),
            worker_image_pull_policy=env.get("STREAMJOBS_WORKER_IMAGE_PULL_POLICY", defaults.worker_image_pull_policy),
            default_redis_url=env.get("STREAMJOBS_DEFAULT_REDIS_URL") or None,
            worker_resources=json.loads(env.get("STREAMJOBS_WORKER_RESOURCES") or "{}"),
            worker_service_account=env.get("STREAMJOBS_WORKER_SERVICE_ACCOUNT") or None,
            ready_timeout_s=float(env.get("STREAMJOBS_READY_TIMEOUT_S", defaults.ready_timeout_s)),
            status_interval_s=float(env.get("STREAMJOBS_STATUS_INTERVAL_S", defaults.status_interval_s)),
        )
