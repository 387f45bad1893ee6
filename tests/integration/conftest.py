"""A window job's deployed plan in a real Redis, for the rescale controller and handover tests."""

from __future__ import annotations

import pytest
from streamjobs_core.jobstore import RedisJobStore

from ..jobs.control import control_plan


@pytest.fixture
def plan(r):
    plan = control_plan()
    RedisJobStore(r, plan.name).deploy(plan)
    return plan


@pytest.fixture
def jobs(r, plan) -> RedisJobStore:
    return RedisJobStore(r, plan.name)


@pytest.fixture
def split_again(r):
    """`split_again(stage, store, max_parallelism)`: the stage's state as its workers commit it (`store`'s pending
    changes as changelog entries, then snapshots of half its key groups), in a job of that one stage fed by
    generator sources, split again under `max_parallelism` (resplit.py) and read back by the worker's recovery into
    a store of every new key group."""
    from streamjobs_core.exchange import RedisExchange
    from streamjobs_core.loading import parse_job
    from streamjobs_core.plan import JobPlan
    from streamjobs_core.resplit import resplit
    from streamjobs_core.statelog import changelog_fields, state_layout
    from streamjobs_worker import recovery
    from streamjobs_worker.state import KeyGroupStore

    def split(stage, store, max_parallelism: int) -> KeyGroupStore:
        old = max(store.key_groups) + 1
        sources = [{"name": name, "type": "zipf", "vocabulary": 10, "rate": {"recordsPerSecond": 10}}
                   for name in stage.inputs]
        job = parse_job({"apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "split"},
                         "spec": {"maxParallelism": old, "sources": sources,
                                  "stages": [stage.model_dump(mode="json", by_alias=True, exclude_none=True)],
                                  "sinks": [{"name": "out", "type": "redis_stream", "inputs": [stage.name]}]}})
        plan = JobPlan(job, 0)
        jobs = RedisJobStore(r, plan.name)
        jobs.deploy(plan)
        for kg, changes in store.drain_changes().items():
            r.xadd(plan.keys.changelog(stage.name, kg), changelog_fields(changes))
        exchange = RedisExchange(r, jobs)
        applied = recovery.restore(exchange, plan.keys, stage.name, KeyGroupStore(range(old), layout=state_layout(stage)))
        recovery.snapshot(r, plan.keys, stage.name, store, applied, range(0, old, 2))
        resplit(jobs, max_parallelism)
        again = KeyGroupStore(range(max_parallelism))
        again.bind(state_layout(stage))
        recovery.restore(exchange, plan.keys, stage.name, again)
        return again

    return split
