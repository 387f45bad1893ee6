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
