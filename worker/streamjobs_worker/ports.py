"""What a worker runs over, handed to it instead of built from a Redis client: the job's store (its control
records), its exchange (record streams, state, the fenced commit) and the job's Redis for the connectors that
read one themselves (external streams, lookup tables kept as hashes). Over Redis all three share one client;
a job run in one process can run over memory (`MemoryJobStore`, `MemoryExchange`), where there is no Redis
for those connectors."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import redis
from streamjobs_core.exchange import Exchange, MemoryExchange, RedisExchange
from streamjobs_core.jobstore import JobStore, MemoryJobStore, RedisJobStore
from streamjobs_core.layout import JobKeys


@dataclass(frozen=True)
class Ports:
    jobs: JobStore
    exchange: Exchange
    redis: redis.Redis | redis.RedisCluster | None = None

    @classmethod
    def over_redis(cls, r: redis.Redis | redis.RedisCluster, job: str) -> Ports:
        jobs = RedisJobStore(r, job)
        return cls(jobs, RedisExchange(r, jobs), r)

    @classmethod
    def in_memory(cls, job: str) -> Ports:
        """A job's store and exchange in this process's memory, for a job whose workers are its threads."""
        jobs = MemoryJobStore()
        return cls(jobs, MemoryExchange(jobs, JobKeys(job)))

    def severable(self, severed: threading.Event) -> Ports:
        """The same ports, every call of which fails once `severed` is set, as a killed process's would never
        arrive: a worker thread abandoned as by SIGKILL. A commit under way when it is set lands whole."""
        return Ports(_Severable(self.jobs, severed), _Severable(self.exchange, severed), self.redis)


class _Severable:
    def __init__(self, target, severed: threading.Event) -> None:
        self._target, self._severed = target, severed

    def __getattr__(self, name: str):
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            if self._severed.is_set():
                raise ConnectionError("this worker was killed")
            return attribute(*args, **kwargs)

        return call

