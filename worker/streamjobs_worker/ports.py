"""What a worker runs over, handed to it instead of built from a Redis client: the job's store (its control
records), its exchange (record streams, state, the fenced commit) and the job's Redis for the connectors that
read one themselves (external streams, lookup tables kept as hashes). Over Redis all three share one client;
a job run in one process can run over memory (`MemoryJobStore`, `MemoryExchange`), where there is no Redis
for those connectors."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from streamjobs_core.exchange import Exchange, RedisExchange
from streamjobs_core.jobstore import JobStore, RedisJobStore


@dataclass(frozen=True)
class Ports:
    jobs: JobStore
    exchange: Exchange
    redis: redis.Redis | redis.RedisCluster | None = None

    @classmethod
    def over_redis(cls, r: redis.Redis | redis.RedisCluster, job: str) -> Ports:
        jobs = RedisJobStore(r, job)
        return cls(jobs, RedisExchange(r, jobs), r)

