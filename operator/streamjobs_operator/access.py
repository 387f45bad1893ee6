"""Redis access per job: an ACL user whose keys are the job's own, for the job's workers.

Workers run user code (SQL, pyspark functions) with whatever Redis rights they
hold. With `STREAMJOBS_REDIS_ACL` on (the chart's default for its own Redis), the
operator creates, at deploy, a Redis user per StreamJob that may touch only the
keys `sj:{<namespace>/<name>}:*` (and read the lookup tables the operator's
configuration lets the job's namespace read), with none of the server's
dangerous or administrative commands, and a generated password in a Secret in
the job's namespace, owned by the StreamJob. Its workers connect as that user;
the finalizer deletes the user. So a worker of job A is refused any key of job B
by Redis itself, whatever its code does. Key names are still visible to SCAN (a
keyless command); their values are not.
"""

from __future__ import annotations

import secrets

from streamjobs_core.layout import JobKeys

from .resources import JobAccess

# What a worker may run, on top of its keys: everything but the server's dangerous and administrative commands
# (CONFIG, FLUSHALL, KEYS, MONITOR, ACL, DEBUG, RESTORE, ...), no Pub/Sub channel, and the cluster commands a
# Redis Cluster client needs to find slots.
_COMMANDS = ("+@all", "-@dangerous", "-@admin", "+cluster|slots", "+cluster|shards", "+cluster|myid")


def rules(keys: JobKeys, password: str, tables: tuple[str, ...] = ()) -> list[str]:
    """ACL SETUSER rules: the user as a whole (`reset` first), so that applying them again is idempotent."""
    return ["reset", "on", f">{password}", f"~{keys.prefix}:*", *(f"%R~{table}*" for table in tables),
            "resetchannels", *_COMMANDS]


def new_password() -> str:
    return secrets.token_urlsafe(32)


def grant(r, access: JobAccess, keys: JobKeys, password: str, tables: tuple[str, ...] = ()) -> None:
    _on_every_node(r, "ACL", "SETUSER", access.username, *rules(keys, password, tables))


def revoke(r, access: JobAccess) -> None:
    _on_every_node(r, "ACL", "DELUSER", access.username)


def _on_every_node(r, *command: str) -> None:
    """A Redis Cluster keeps ACLs per node: every node must know the user."""
    import redis

    if isinstance(r, redis.RedisCluster):
        r.execute_command(*command, target_nodes=redis.RedisCluster.ALL_NODES)
    else:
        r.execute_command(*command)
