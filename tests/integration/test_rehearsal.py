"""A new instance rehearses its stage on records peeked from its input streams before it says it is ready:
the stage's own query runs once, and nothing in Redis changes (no offset, no state, no output)."""

from __future__ import annotations

import pyarrow as pa
from streamjobs_core.codec import encode
from streamjobs_worker.ports import Ports
from streamjobs_worker.rehearsal import SAMPLE_RECORDS, rehearse


def put(r, plan, kg: int, table: pa.Table) -> None:
    r.xadd(plan.keys.kg_stream("src", "agg", kg), encode(table, 100, [(0, 11)]))


def words(*ws: str) -> pa.Table:
    n = len(ws)
    return pa.table({"word": list(ws), "event_time": pa.array([1_000] * n, pa.int64()),
                     "_ingest_ms": pa.array([1_000] * n, pa.int64())})


def test_a_rehearsal_runs_the_stage_query_on_sampled_records_and_changes_nothing(r, plan, spark):
    put(r, plan, 3, words("a", "b"))
    put(r, plan, 7, words("c"))
    before = {key: r.dump(key) for key in r.keys("*")}
    tracker = spark.sparkContext.statusTracker()
    jobs = len(tracker.getJobIdsForGroup())
    assert rehearse(Ports.over_redis(r, plan.id), plan, "agg") == 3
    assert len(tracker.getJobIdsForGroup()) > jobs  # Spark ran the window's partial query
    assert {key: r.dump(key) for key in r.keys("*")} == before


def test_at_a_start_a_stage_rehearses_on_records_its_generator_source_will_make(r, plan, spark):
    before = {key: r.dump(key) for key in r.keys("*")}
    # Its streams are empty: the zipf source's first records.
    assert rehearse(Ports.over_redis(r, plan.id), plan, "agg") == SAMPLE_RECORDS
    assert {key: r.dump(key) for key in r.keys("*")} == before


def test_a_failed_rehearsal_is_only_logged_and_a_sink_has_nothing_to_rehearse(r, plan, spark):
    put(r, plan, 3, pa.table({"not_the_key": [1]}))  # the query cannot resolve `word`
    assert rehearse(Ports.over_redis(r, plan.id), plan, "agg") == 0
    assert rehearse(Ports.over_redis(r, plan.id), plan, "out") == 0  # a sink runs no stage query
