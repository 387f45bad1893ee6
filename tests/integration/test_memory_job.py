"""A whole job runs in one process over memory as over Redis: its workers are handed a job store and an exchange
(the memory ones: no Redis anywhere), are stepped by hand, one is replaced mid-run as a SIGKILL would have it,
and the counts come out exact: against the records the source generates, counted here with pandas, and by the
oracle, which reads the run through the same ports."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from streamjobs.oracle import verify
from streamjobs_core import generators
from streamjobs_core.exchange import Exchange, Fenced, MemoryExchange
from streamjobs_core.jobstore import JobStore, MemoryJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.rescale import RescaleController
from streamjobs_worker.ports import Ports
from streamjobs_worker.worker import Worker

RECORDS, WINDOW_MS = 4_000, 500


def job():
    return parse_job({"metadata": {"name": "in-memory"}, "spec": {
        "maxParallelism": 8,
        "batching": {"maxRecords": 300},
        "sources": [{"name": "words", "type": "zipf", "vocabulary": 40, "exponent": 1.1, "parallelism": 2,
                     "totalRecords": RECORDS, "rate": {"profile": "constant", "recordsPerSecond": 2_000}}],
        "stages": [{"name": "count", "type": "window_aggregate", "inputs": ["words"], "keyBy": "word",
                    "parallelism": 2, "window": {"type": "tumbling", "sizeMs": WINDOW_MS},
                    "aggregations": [{"function": "count", "as": "n"}]}],
        "sinks": [{"name": "counts", "type": "redis_stream", "inputs": ["count"]}],
    }})


def expected(plan: JobPlan) -> Counter:
    records = generators.generate(plan.spec.operator("words"), plan.t0_ms, np.arange(RECORDS)).to_pandas()
    start = records["event_time"].astype("int64") // WINDOW_MS * WINDOW_MS
    return Counter({(int(s), w): int(n) for (s, w), n in records.groupby([start, records["word"]]).size().items()})


def written(exchange: Exchange, plan: JobPlan) -> Counter:
    key = plan.keys.output_stream("counts")
    out: Counter = Counter()
    for _, fields in exchange.after({key: None})[key]:
        out[(int(fields[b"window_start"]), fields[b"word"].decode())] += int(fields[b"n"])
    return out


def emitted(jobs: JobStore, plan: JobPlan) -> int:
    progress = jobs.partitions("words", range(plan.key_groups("words")))
    return sum(int(committed.cursor) for committed, _ in progress.values() if committed is not None)


def step_all(workers: dict, rounds: int) -> None:
    for _ in range(rounds):
        for worker in workers.values():
            worker.step()


class SteppedFleet:
    """The job's instances as workers this test steps by hand (the `Fleet` of the fluid and batched rescales):
    every wait of the rescale controller is a round of steps, so key groups move between live workers."""

    def __init__(self, ports: Ports, plan: JobPlan) -> None:
        self.ports, self.plan = ports, plan
        self.workers: dict[tuple[str, int], Worker] = {}
        for op in plan.vertices:
            self.add_instances(op, plan.initial_assignment(op).parallelism)

    def add_instances(self, op: str, parallelism: int) -> None:
        for instance in range(parallelism):
            if (op, instance) not in self.workers:
                self.restart(op, instance)

    def remove_instances(self, op: str, parallelism: int) -> None:
        for op_, instance in [k for k in self.workers if k[0] == op and k[1] >= parallelism]:
            self.workers.pop((op_, instance)).close()

    def restart(self, op: str, instance: int) -> Worker | None:
        """A new incarnation of the instance, restored from the commits; the one it replaces, if any."""
        worker = Worker(self.ports, self.plan, op, instance)
        worker.restore()
        old, self.workers[(op, instance)] = self.workers.get((op, instance)), worker
        return old

    def sleep(self, _seconds: float) -> None:
        step_all(self.workers, 1)


def ports_over(underneath: str, plan: JobPlan, request) -> Ports:
    if underneath == "redis":
        return Ports.over_redis(request.getfixturevalue("r"), plan.id)
    jobs = MemoryJobStore()
    return Ports(jobs, MemoryExchange(jobs, plan.keys))


@pytest.mark.parametrize("underneath", ["memory", "redis"])
def test_a_job_counts_exactly_through_a_replaced_worker_over_memory_as_over_redis(underneath, request, spark):
    plan = JobPlan(job(), int(time.time() * 1000) - 1_000)  # a second of records due at once, the rest paced
    ports = ports_over(underneath, plan, request)
    jobs, exchange = ports.jobs, ports.exchange
    jobs.deploy(plan)
    fleet = SteppedFleet(ports, plan)
    workers = fleet.workers
    assert len(workers) == 5  # the sink is not chained after the window: one instance of its own
    step_all(workers, 4)

    # "SIGKILL": count/0 is abandoned with what it read and did not commit; its next incarnation restores
    # from the commits, and the abandoned one can no longer commit anything.
    old = fleet.restart("count", 0)
    step_all({k: w for k, w in workers.items() if k[0] == "words"}, 2)
    with pytest.raises(Fenced):
        for _ in range(50):
            old.step()

    # A batched rescale of the window stage (2 -> 3) while the source goes on: markers in the streams,
    # releases in the old owners' commits, take-overs by the new instance, all through the ports.
    record = RescaleController(jobs, plan, fleet, sleep=fleet.sleep).rescale("count", 3, "batched")
    assert record.moved_key_groups > 0 and jobs.assignment("count").parallelism == 3
    assert sorted(k for k in workers if k[0] == "count") == [("count", 0), ("count", 1), ("count", 2)]

    deadline = time.monotonic() + 60
    while emitted(jobs, plan) < RECORDS:  # committed: the source's offsets
        step_all(workers, 1)
        assert time.monotonic() < deadline, "the source did not emit every record"
    jobs.request_stop()
    while exchange.members(plan.keys.done("counts")) != {b"0"}:
        step_all(workers, 1)
        assert time.monotonic() < deadline, "the job did not drain"
    assert written(exchange, plan) == expected(plan)
    verdict = verify(spark, ports, plan)  # the oracle reads the run through the same ports
    assert (verdict["lost"], verdict["duplicated"], verdict["correct"]) == (0, 0, True), verdict
