"""What a valid spec may still not do on a shared cluster, as the operator's configuration says (config.py).

Whoever may create a StreamJob in a namespace writes its spec; the spec alone (no code) must not reach
another tenant's data or the workers' credentials: SQL that calls into the JVM (sqlguard.py), a lookup
table outside the job's keys and the tables its namespace may read, a Redis the operator would send a
Secret's password to without being told it may. Each is an error naming its field, as the spec model's.
"""

from __future__ import annotations

from streamjobs_core.layout import JobKeys
from streamjobs_core.spec import LookupStage, StreamJob
from streamjobs_core.sqlguard import refused_calls

from .config import Settings
from .resources import Owner


def refusals(job: StreamJob, owner: Owner, settings: Settings) -> list[tuple[str, str]]:
    errors = [] if settings.allow_jvm_functions else refused_calls(job)
    own, tables = f"{JobKeys(owner.job).prefix}:", settings.tables(owner.namespace)
    for i, stage in enumerate(job.spec.stages):
        prefix = stage.table.redis_key_prefix if isinstance(stage, LookupStage) else None
        if prefix is not None and not prefix.startswith((own, *tables)):
            readable = ", ".join(f"'{t}'" for t in tables) or "none"
            errors.append((f"spec.stages[{i}].table.redisKeyPrefix",
                           f"'{prefix}' is neither under the job's own keys ('{own}') nor a table the jobs of "
                           f"namespace '{owner.namespace}' may read ({readable}; the operator's "
                           "STREAMJOBS_LOOKUP_TABLES)"))
    url = job.spec.redis.url
    if url is not None and url != settings.default_redis_url and url not in settings.redis_urls:
        errors.append(("spec.redis.url", "not a Redis this operator may connect to (its STREAMJOBS_REDIS_URLS): it "
                                         "would send the job's Secret's password there"))
    return errors
