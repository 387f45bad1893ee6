"""When a worker runs what it has read: at once where that lowers latency, paced where it would not."""

from __future__ import annotations

from streamjobs_core.deadletters import DeadLetter, Kind
from streamjobs_core.exchange import MemoryStreams
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.spec import BatchingSettings, SqlStage, WindowAggregateStage
from streamjobs_core.watermarks import MAX_WATERMARK
from streamjobs_worker.inputs import InputBatch, open_input
from streamjobs_worker.metrics import WorkerMetrics
from streamjobs_worker.pacing import Pacing
from streamjobs_worker.ports import Ports

from ..jobs.control import control_plan

BATCHING = BatchingSettings(minIntervalMs=500, maxWaitMs=100)
WINDOW = WindowAggregateStage.model_validate({
    "name": "w", "type": "window_aggregate", "inputs": ["src"], "keyBy": "k", "window": {"sizeMs": 1000},
    "aggregations": [{"function": "count", "as": "n"}]})
SQL = SqlStage.model_validate({"name": "s", "type": "sql", "inputs": ["src"], "query": "SELECT * FROM input"})


def batch(records: int, watermarks: dict[int, int], **kwargs) -> InputBatch:
    return InputBatch(records=records, watermarks=watermarks, watermark=min(watermarks.values()), **kwargs)


def test_a_window_stage_waits_until_a_window_is_due_in_some_key_group():
    pacing = Pacing(BATCHING, WINDOW)
    pacing.ran(batch(0, {0: 500, 1: 500}), 0.1, now=0.0)
    assert not pacing.due(batch(10, {0: 900, 1: 999}), releasing=False, now=0.1)  # no window ended yet
    assert pacing.due(batch(10, {0: 900, 1: 1000}), releasing=False, now=0.1)  # [0, 1000) ends in kg 1


def test_a_window_stage_runs_records_that_waited_min_interval_and_never_waits_on_backlog():
    pacing = Pacing(BATCHING, WINDOW)
    pacing.ran(batch(0, {0: 500}), 0.1, now=0.9)
    assert not pacing.due(batch(10, {0: 600}), False, now=1.0)
    assert pacing.wait_ms(batch(10, {0: 600}), now=1.2) == 100  # maxWaitMs: the loop polls handovers meanwhile
    assert pacing.wait_ms(batch(10, {0: 600}), now=1.45) == 50  # reads block at most until it is due
    assert pacing.due(batch(10, {0: 600}), False, now=1.5)
    assert pacing.due(batch(10, {0: 600}, full=True), False, now=1.0)


def test_a_window_stage_tells_downstream_its_watermark_at_least_every_min_interval():
    pacing = Pacing(BATCHING, WINDOW)
    pacing.ran(batch(0, {0: 500}), 0.1, now=0.0)
    assert not pacing.due(batch(0, {0: 600}), False, now=0.2)
    assert pacing.due(batch(0, {0: 600}), False, now=0.5)


def test_handovers_bad_entries_and_the_end_of_input_run_at_once():
    pacing = Pacing(BATCHING, WINDOW)
    pacing.ran(batch(0, {0: 500}), 0.1, now=0.0)
    assert pacing.due(batch(0, {0: 500}), releasing=True, now=0.01)
    assert pacing.due(batch(0, {0: 500}, bad=[DeadLetter.of("op", Kind.UNDECODABLE, "undecodable", None, "s", b"1-0")]), False, now=0.01)
    assert pacing.due(batch(0, {0: MAX_WATERMARK}), False, now=0.01)


def test_a_stateless_stage_runs_on_arrival_but_spends_at_most_half_its_time_on_fixed_cost():
    pacing = Pacing(BATCHING, SQL)
    assert pacing.due(batch(1, {0: 0}), False, now=0.0)  # the first record runs at once
    pacing.ran(batch(1, {0: 0}), busy_s=0.08, now=0.08)
    assert not pacing.due(batch(1, {0: 10}), False, now=0.10)  # 20 ms after a batch of 80 ms
    assert pacing.due(batch(1, {0: 10}), False, now=0.16)
    pacing.ran(batch(1, {0: 10}), busy_s=0.002, now=1.0)  # a cheap batch (a Redis sink) is not held back
    assert pacing.due(batch(1, {0: 20}), False, now=1.002)
    assert not pacing.due(batch(0, {0: 10}), False, now=2.0)  # nothing read, watermark unchanged


def test_a_source_always_runs_its_tick_while_kg_streams_are_paced():
    plan, jobs = control_plan(), MemoryJobStore()
    ports = Ports(jobs, MemoryStreams())
    source = open_input(ports, plan, "src", 0, (0,), WorkerMetrics(plan.id, "src", 0), lambda version: True)
    streams = open_input(ports, plan, "agg", 0, (0,), WorkerMetrics(plan.id, "agg", 0), lambda version: True)
    pacing = Pacing(BATCHING, WINDOW)
    pacing.ran(batch(0, {0: 500}), 0.1, now=0.0)
    assert source.due(pacing, batch(10, {0: 600}), False, now=0.1)
    assert not streams.due(pacing, batch(10, {0: 600}), False, now=0.1)


def test_a_source_polls_once_a_tick_at_once_when_behind_and_paces_a_chained_spark_stage():
    pacing = Pacing(BATCHING, None)
    pacing.ran(batch(1, {0: 0}), busy_s=0.01, now=1.0)
    assert pacing.source_wait_ms(behind=False, now=1.0) == 40  # the next tick starts 50 ms after this one did
    assert pacing.source_wait_ms(behind=True, now=1.0) == 0
    chained = Pacing(BATCHING, None, runs_spark=True)
    chained.ran(batch(1, {0: 0}), busy_s=0.2, now=1.0)
    assert chained.source_wait_ms(behind=False, now=1.05) == 150  # half its time at most on a 200 ms batch


def test_a_window_stage_holds_waiting_records_back_when_a_window_end_is_close():
    pacing = Pacing(BATCHING, WINDOW)
    pacing.ran(batch(10, {0: 500}), busy_s=0.1, now=0.0)
    assert not pacing.due(batch(10, {0: 550}), False, now=0.1)
    assert pacing.due(batch(10, {0: 600}), False, now=0.6)  # 400 ms to the end of [0, 1000): room for a batch
    pacing.ran(batch(10, {0: 600}), busy_s=0.1, now=0.6)
    pacing.ran(batch(0, {0: 650}), busy_s=0.001, now=0.65)  # a watermark-only batch says nothing of Spark's cost
    assert not pacing.due(batch(10, {0: 700}), False, now=0.7)
    assert not pacing.due(batch(10, {0: 950}), False, now=1.3)  # 50 ms before it: the end fires them soon
    assert pacing.due(batch(10, {0: 1000}), False, now=1.35)


def test_records_held_back_for_a_window_end_run_when_the_input_goes_idle():
    pacing = Pacing(BATCHING, WINDOW)
    pacing.ran(batch(10, {0: 500}), busy_s=0.2, now=0.0)
    assert not pacing.due(batch(10, {0: 980}), False, now=0.1)
    assert not pacing.due(batch(10, {0: 980}), False, now=0.8)  # 20 ms of event time to go: wait for it
    assert pacing.due(batch(10, {0: 980}), False, now=1.0)  # it did not come: run them
