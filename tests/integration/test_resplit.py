"""A job's key groups split again under another maxParallelism (resplit.py), against a real Redis: the state the
worker's own recovery reads back, the records in flight routed again, the generator's offsets, and what it
refuses."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
import yaml
from streamjobs_core.codec import decode, encode, encode_marker
from streamjobs_core.control import PartitionProgress
from streamjobs_core.exchange import RedisExchange
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.keygroups import Assignment, key_groups_of
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.resplit import CannotResplit, in_flight, resplit
from streamjobs_core.statelog import WINDOW_STATE, ChangeSet, changelog_fields
from streamjobs_worker import recovery
from streamjobs_worker.state import KeyGroupStore

from ..e2e.conftest import ROOT

WORDS = [f"w{i}" for i in range(300)]
UNREAD = [f"u{i}" for i in range(150)]  # words in flight: produced into `count`'s streams, not read yet


@pytest.fixture
def deployed(r):
    job = parse_job(yaml.safe_load((ROOT / "tests/jobs/wordcount-small.yaml").read_text()))
    plan = JobPlan(job, 1_000)
    jobs = RedisJobStore(r, plan.name)
    jobs.deploy(plan)
    return jobs, plan


def _window_rows(words: list[str], ws: int, n: int) -> pa.Table:
    return pa.table({"ws": pa.array([ws] * len(words), pa.int64()), "k": words,
                     "n": pa.array([n] * len(words), pa.int64())})


def _log(r, keys, kg: int, changes: ChangeSet) -> None:
    r.xadd(keys.changelog("count", kg), changelog_fields(changes))


def _committed_state(r, jobs, plan) -> None:
    """`count`'s windows as workers leave them: a changelog per key group, then snapshots of half of them (which
    trim what they cover), then a tail of upserts, deletes and a window that fired (a cut)."""
    keys, old = plan.keys, plan.spec.max_parallelism
    groups = key_groups_of(pa.array(WORDS), old)
    for kg in range(old):
        mine = [w for w, g in zip(WORDS, groups) if g == kg]
        _log(r, keys, kg, ChangeSet(upserts=concat_rows(mine)))
    store = KeyGroupStore(range(old), layout=WINDOW_STATE)
    applied = recovery.restore(RedisExchange(r, jobs), keys, "count", store)
    recovery.snapshot(r, keys, "count", store, applied, range(0, old, 2))
    for kg in range(old):
        mine = [w for w, g in zip(WORDS, groups) if g == kg]
        deletes = _window_rows(mine[:1], 4_000, 0).select(["ws", "k"])
        _log(r, keys, kg, ChangeSet(upserts=_window_rows(mine[1:3], 4_000, 7), deletes=deletes, cut=2_000))
    unread = key_groups_of(pa.array(UNREAD), old)
    for p in range(old):
        jobs.record_partitions(r, "words", {p: PartitionProgress(40 + p)})
        name = keys.kg_stream("words", "count", p)
        read = r.xadd(name, encode(_words(["gone"]), 9_000, [(0, 11)]))
        jobs.record_streams(r, "count", {name: (read, [(0, 5, 9_000 + p), (6, 11, 9_500)])})
        mine = [w for w, g in zip(UNREAD, unread) if g == p]
        r.xadd(name, encode(_words(mine[:3]), 9_600, [(0, 5)]))
        r.xadd(name, encode(None, 9_700, [(0, 11)]))  # a heartbeat
        r.xadd(name, encode(_words(mine[3:]), 9_800, [(6, 11)]))
        r.hset(keys.produced("words", "count"), str(p), 1 + len(mine))
        r.hset(keys.consumed("words", "count"), str(p), 1)


def _words(words: list[str]) -> pa.Table:
    return pa.table({"word": words, "event_time": pa.array([9_900] * len(words), pa.int64())})


def concat_rows(words: list[str]) -> pa.Table:
    return pa.concat_tables([_window_rows(words, 2_000, 1), _window_rows(words, 4_000, 2), _window_rows(words, 6_000, 3)])


def _rows(jobs: RedisJobStore, key_groups: int) -> tuple[Counter, dict[int, pa.Table]]:
    store = KeyGroupStore(range(key_groups), layout=WINDOW_STATE)
    recovery.restore(RedisExchange(jobs.r, jobs), jobs.keys, "count", store)
    tables = {kg: t for kg in range(key_groups) if (t := store.table(kg)) is not None}
    rows = Counter(tuple(sorted(row.items())) for t in tables.values() for row in t.to_pylist())
    return rows, tables


def test_state_and_records_in_flight_are_split_again_as_the_workers_read_them(r, deployed):
    jobs, plan = deployed
    keys = plan.keys
    _committed_state(r, jobs, plan)
    before, _ = _rows(jobs, 12)
    assert len(before) == 2 * len(WORDS) - 12  # less the cut window, one deleted per kg
    assert f"{len(UNREAD)} records from 'words' not processed by 'count' yet" in in_flight(jobs, plan)  # not drained

    after_plan = resplit(jobs, 20)

    # The worker's recovery under 20 key groups reads every row once, each in its key's key group.
    after, tables = _rows(jobs, 20)
    assert after == before
    assert any(kg >= 12 for kg in tables)
    for kg, table in tables.items():
        assert set(key_groups_of(table.column("k"), 20).tolist()) == {kg}
    # The generator keeps its 12 partitions and their offsets.
    assert after_plan.kept_partitions == (("words", 12),) and after_plan.key_groups("words") == 12
    assert {p: int(step.cursor) for p, (step, _) in jobs.partitions("words", range(12)).items()} == {
        p: 40 + p for p in range(12)}
    # The records not read yet wait in the new key groups of their words, with the least watermark `count` had
    # heard, which its new streams start from.
    waiting = Counter()
    for kg in range(20):
        entries = [decode(fields) for _, fields in r.xrange(keys.kg_stream("words", "count", kg))]
        words = [w for e in entries for w in e.table.column("word").to_pylist()]
        assert set(key_groups_of(pa.array(words, pa.string()), 20).tolist()) <= {kg}
        assert {(e.watermark, e.runs) for e in entries} <= {(9_000, ((0, 11),))}
        assert int(r.hget(keys.produced("words", "count"), str(kg)) or 0) == len(words)
        waiting.update(words)
    assert waiting == Counter(UNREAD) and not r.exists(keys.consumed("words", "count"))
    streams = jobs.streams("count", [keys.kg_stream("words", "count", kg) for kg in range(20)])
    assert streams == [(b"0-0", [(0, 11, 9_000)])] * 20
    assert after_plan == jobs.plan() and after_plan.version == plan.version + 1
    assert after_plan.spec.max_parallelism == 20 and jobs.plan_version(plan.version) == plan
    assignment = jobs.assignment("count")
    assert assignment.parallelism == 2 and len(assignment.owners) == 20 and assignment.epoch == 2
    assert jobs.versions("count") == dict.fromkeys(range(20), 1)
    assert jobs.versions("words") == dict.fromkeys(range(12), 1) and jobs.cut(1)[("words", 5)] == b"45"
    [record] = jobs.reconfigure_history()
    assert record.version == 1 and "spec.maxParallelism: 12 -> 20" in record.changes[0]


def test_a_marker_in_flight_is_refused_and_nothing_changes(r, deployed):
    """A savepoint is never taken mid-rescale (savepoint.take refuses); were one written by hand, the re-split
    would not guess whose records follow a handover marker."""
    jobs, plan = deployed
    _committed_state(r, jobs, plan)
    r.xadd(plan.keys.kg_stream("words", "count", 7), encode_marker(1))
    before = {key: r.dump(key) for key in r.scan_iter(match=plan.keys.pattern)}
    with pytest.raises(CannotResplit, match=r"words>count:7 holds a rescale's marker"):
        resplit(jobs, 20)
    assert {key: r.dump(key) for key in r.scan_iter(match=plan.keys.pattern)} == before


def test_more_instances_running_than_the_new_key_groups_are_refused(r, deployed):
    """The spec says 2 `count` instances, which 2 key groups hold, but the job was rescaled to 3."""
    jobs, plan = deployed
    _committed_state(r, jobs, plan)
    jobs.write_assignment("count", Assignment.ranges(3, 12))
    with pytest.raises(CannotResplit, match="'count' runs 3 instances, more than the 2 key groups"):
        resplit(jobs, 2)
