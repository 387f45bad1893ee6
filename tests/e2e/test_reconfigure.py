"""Live reconfiguration of a running job, checked per record against the oracle."""

from __future__ import annotations

from collections import Counter

import redis
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import load_job

from .conftest import ROOT, assert_exact, in_a_thread, killer


def test_a_new_query_and_where_switch_at_one_cut_through_sigkills_mid_alignment(redis_server, run):
    """`tag` (a query on its own workers) and `count` (a window) change live while words flow; a `tag` and a
    `count` instance are SIGKILLed while the barriers travel. Every record is processed under the plan in
    force at its source offset by every operator: the oracle replays each one under its version, so a record
    processed under both plans, or neither, or the wrong one, shows as lost or duplicated."""
    new = load_job(ROOT / "tests/jobs/reconfigured-v1.yaml")
    records = []
    reconfigure = in_a_thread(lambda runtime: records.append(runtime.reconfigure(new)))
    kills = killer([(12.3, "tag", 0), (12.8, "count", 1)])

    def during(runtime, elapsed: float) -> None:
        if elapsed > 12:
            reconfigure(runtime)
        kills(runtime, elapsed)

    report = run("tests/jobs/reconfigured.yaml", 40, during=during)
    assert_exact(report)
    assert kills.killed == ["tag/0", "count/1"]
    assert len(records) == 1 and records[0].version == 1, records
    assert report["reconfigurations"] == [records[0].as_dict()]
    assert set(records[0].aligned_ms) >= {"tag/0", "tag/1", "count/0", "count/1"}
    tags = Counter(fields[b"tag"] for _, fields in redis.Redis.from_url(redis_server.url).xrange(
        JobKeys("reconfigured").output_stream("tagged")))
    assert tags[b"v0"] > 1000 and tags[b"v1"] > 1000, tags
