"""A job's key groups split again under another maxParallelism (resplit.py), against a real Redis: the state the
worker's own recovery reads back, the generator's offsets, the streams, and what a job not drained is refused."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
import yaml
from streamjobs_core import generators
from streamjobs_core.control import PartitionProgress
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
FRONTIER = 4_321  # the global index every generator partition read up to


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
    applied = recovery.restore(r, keys, "count", store)
    recovery.snapshot(r, keys, "count", store, applied, range(0, old, 2))
    for kg in range(old):
        mine = [w for w, g in zip(WORDS, groups) if g == kg]
        deletes = _window_rows(mine[:1], 4_000, 0).select(["ws", "k"])
        _log(r, keys, kg, ChangeSet(upserts=_window_rows(mine[1:3], 4_000, 7), deletes=deletes, cut=2_000))
    for p in range(old):
        jobs.record_partitions(r, "words", {p: PartitionProgress(generators.local_count(p, old, FRONTIER))})
        name = keys.kg_stream("words", "count", p)
        jobs.record_streams(r, "count", {name: (b"1-0", [(0, 5, 9_000 + p), (6, 11, 9_500)])})
        r.hset(keys.produced("words", "count"), str(p), 40)
        r.hset(keys.consumed("words", "count"), str(p), 40)
        r.xadd(name, {"m": b"consumed"})


def concat_rows(words: list[str]) -> pa.Table:
    return pa.concat_tables([_window_rows(words, 2_000, 1), _window_rows(words, 4_000, 2), _window_rows(words, 6_000, 3)])


def _rows(r, keys, key_groups: int) -> tuple[Counter, dict[int, pa.Table]]:
    store = KeyGroupStore(range(key_groups), layout=WINDOW_STATE)
    recovery.restore(r, keys, "count", store)
    tables = {kg: t for kg in range(key_groups) if (t := store.table(kg)) is not None}
    rows = Counter(tuple(sorted(row.items())) for t in tables.values() for row in t.to_pylist())
    return rows, tables


def test_state_offsets_and_streams_are_split_again_as_the_workers_read_them(r, deployed):
    jobs, plan = deployed
    keys = plan.keys
    _committed_state(r, jobs, plan)
    before, _ = _rows(r, keys, 12)
    assert in_flight(jobs, plan) == [] and len(before) == 2 * len(WORDS) - 12  # less the cut window, one deleted per kg

    after_plan = resplit(jobs, 20)

    # The worker's recovery under 20 key groups reads every row once, each in its key's key group.
    after, tables = _rows(r, keys, 20)
    assert after == before
    assert any(kg >= 12 for kg in tables)
    for kg, table in tables.items():
        assert set(key_groups_of(table.column("k"), 20).tolist()) == {kg}
    # The generator's 20 partitions start where its 12 had all read up to: no index twice, none skipped.
    progress = jobs.partitions("words", range(20))
    read = np.sort(np.concatenate([generators.global_indices(p, 20, 0, int(step.cursor)) for p, (step, _) in
                                   progress.items()]))
    assert np.array_equal(read, np.arange(FRONTIER))
    # The streams start empty, and `count` has heard the least watermark any of its streams had.
    streams = jobs.streams("count", [keys.kg_stream("words", "count", kg) for kg in range(20)])
    assert streams == [(b"0-0", [(0, 19, 9_000)])] * 20
    assert not r.exists(keys.kg_stream("words", "count", 3), keys.produced("words", "count"))
    assert after_plan == jobs.plan() and after_plan.version == plan.version + 1
    assert after_plan.spec.max_parallelism == 20 and jobs.plan_version(plan.version) == plan
    assignment = jobs.assignment("count")
    assert assignment.parallelism == 2 and len(assignment.owners) == 20 and assignment.epoch == 2
    assert jobs.versions("count") == dict.fromkeys(range(20), 1)
    assert jobs.cut(1)[("words", 5)] == str(generators.local_count(5, 12, FRONTIER)).encode()
    [record] = jobs.reconfigure_history()
    assert record.version == 1 and "spec.maxParallelism: 12 -> 20" in record.changes[0]


@pytest.mark.parametrize("undrained", ["lag", "frontier"])
def test_a_job_not_drained_is_refused_naming_what_is_in_flight_and_nothing_changes(r, deployed, undrained):
    jobs, plan = deployed
    _committed_state(r, jobs, plan)
    if undrained == "lag":
        r.hincrby(plan.keys.produced("words", "count"), "7", 5)
    else:
        jobs.record_partitions(r, "words", {3: PartitionProgress(generators.local_count(3, 12, FRONTIER) + 1)})
    before = {key: r.dump(key) for key in r.scan_iter(match=plan.keys.pattern)}
    expected = "5 records from 'words' not processed by 'count'" if undrained == "lag" else \
        "source 'words': its partitions have not read up to one global index"
    with pytest.raises(CannotResplit, match=expected):
        resplit(jobs, 20)
    assert {key: r.dump(key) for key in r.scan_iter(match=plan.keys.pattern)} == before


def test_more_instances_running_than_the_new_key_groups_are_refused(r, deployed):
    """The spec says 2 `count` instances, which 2 key groups hold, but the job was rescaled to 3."""
    jobs, plan = deployed
    _committed_state(r, jobs, plan)
    jobs.write_assignment("count", Assignment.ranges(3, 12))
    with pytest.raises(CannotResplit, match="'count' runs 3 instances, more than the 2 key groups"):
        resplit(jobs, 2)
