"""Live reconfiguration's control side: what may change live, and the controller's wait for every key group."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamjobs_core.codec import decode, encode_barrier
from streamjobs_core.control import ControlEvent, ReconfigureRequest, ReconfigureState
from streamjobs_core.exchange import Fence, MemoryExchange, Transaction
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.loading import load_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.reconfigure import How, ReconfigureController, Refused, diff, holds_back, plan_for, plan_in_force
from streamjobs_core.watermarks import MIN_WATERMARK
from streamjobs_worker.inputs import StreamInput

pytestmark = pytest.mark.unit

JOBS = Path(__file__).resolve().parents[1] / "jobs"


def job(name: str = "reconfigured.yaml"):
    return load_job(JOBS / name)


def edited(base, **paths):
    """`base` with fields changed: op__field=value (an operator's), or section__field=value (spec's)."""
    data = base.model_dump(mode="json", by_alias=True)
    for path, value in paths.items():
        owner, field = path.split("__")
        ops = {op["name"]: op for group in ("sources", "stages", "sinks") for op in data["spec"][group]}
        (ops[owner] if owner in ops else data["spec"].setdefault(owner, {}))[field] = value
    return type(base).model_validate(data)


def test_a_new_query_a_where_and_batching_change_live():
    changes = diff(job(), job("reconfigured-v1.yaml"))
    assert {(c.path, c.how) for c in changes.changes} == {
        ("spec.stages[tag].query", How.LIVE),
        ("spec.stages[count].where", How.LIVE),
        ("spec.batching.maxWaitMs", How.LIVE),
    }
    assert not changes.refused


@pytest.mark.parametrize(("field", "value", "words"), [
    ("count__keyBy", "tag", "state depends on it"),
    ("count__window", {"type": "tumbling", "sizeMs": 5000}, "state depends on it"),
    ("count__aggregations", [{"function": "sum", "column": "n", "as": "n"}], "state depends on it"),
    ("words__vocabulary", 10, "source's settings"),
    ("state__backend", "rocksdb", "where the state lives"),
    ("spec__maxParallelism", 24, "take a savepoint"),
])
def test_changes_the_state_or_the_graph_depend_on_are_refused_naming_the_field(field, value, words):
    base = job()
    if field.startswith("spec__"):
        data = base.model_dump(mode="json", by_alias=True)
        data["spec"][field.split("__")[1]] = value
        new = type(base).model_validate(data)
    else:
        new = edited(base, **{field: value})
    changes = diff(base, new)
    assert len(changes.refused) == 1, changes.lines()
    assert words in changes.refused[0].reason
    assert field.split("__")[1] in changes.refused[0].path


def test_aggregations_added_after_a_windows_others_are_live_and_any_other_change_to_them_refused():
    count = {"function": "count", "as": "n"}
    added = [count, {"function": "max", "column": "event_time", "as": "last"}]
    (change,) = diff(job(), edited(job(), count__aggregations=added)).changes
    assert (change.path, change.how) == ("spec.stages[count].aggregations", How.LIVE)
    assert "null in a window none of them reached" in change.reason
    for other in ([added[1], count], [added[1]], [{**count, "as": "m"}, added[1]]):
        (refused,) = diff(job(), edited(job(), count__aggregations=other)).refused
        assert "state depends on it" in refused.reason, other
    assert not diff(edited(job(), count__aggregations=added), job()).live, "one taken away is refused"


def test_aggregations_added_after_an_over_stages_others_are_live_and_any_other_change_to_them_refused():
    data = job().model_dump(mode="json", by_alias=True)
    count = {"function": "count", "as": "k"}
    data["spec"]["stages"].append({"name": "recent", "type": "over", "inputs": ["tag"], "keyBy": "word", "rows": 3,
                                   "aggregations": [count]})
    data["spec"]["sinks"].append({"name": "recents", "type": "redis_stream", "inputs": ["recent"]})
    base = type(job()).model_validate(data)
    added = [count, {"function": "max", "column": "event_time", "as": "latest"}]
    (change,) = diff(base, edited(base, recent__aggregations=added)).changes
    assert (change.path, change.how) == ("spec.stages[recent].aggregations", How.LIVE)
    assert "records waiting at the switch go out with it null" in change.reason
    for other in ([added[1], count], [added[1]]):
        (refused,) = diff(base, edited(base, recent__aggregations=other)).refused
        assert "state depends on it" in refused.reason, other
    assert diff(base, edited(base, recent__rows=5)).refused, "the history kept is rows - 1 records"


def chained(**changes):
    """reconfigured.yaml with `tag` chained after the source (words -> tag on the same workers), then `changes`
    applied to the dumped spec: stages=..., sinks=... replace those lists."""
    data = job().model_dump(mode="json", by_alias=True)
    data["spec"]["stages"][0]["chain"] = True
    for group, ops in changes.items():
        data["spec"][group] = ops(data["spec"][group])
    return type(job()).model_validate(data)


def test_a_stage_or_sink_added_to_or_removed_from_a_chain_is_live():
    base = chained()
    mark = {"name": "mark", "type": "sql", "inputs": ["words"], "parallelism": 2, "query": "SELECT * FROM input"}
    added = chained(stages=lambda ops: [mark, {**ops[0], "inputs": ["mark"]}, *ops[1:]])
    changes = diff(base, added)
    assert {(c.path, c.how) for c in changes.changes} == {
        ("spec.stages[mark]", How.LIVE), ("spec.stages[tag].inputs", How.LIVE)}
    removed = chained(stages=lambda ops: [{**ops[1], "inputs": ["words"]}],
                      sinks=lambda ops: [{**ops[0], "inputs": ["words"]}, ops[1]])
    changes = diff(base, removed)
    assert not changes.refused and ("spec.stages[tag]", How.LIVE) in {(c.path, c.how) for c in changes.changes}
    # words -> tag -> tagged, one chain with a sink at its tail: a stage goes in before the sink
    alone = chained(stages=lambda ops: [ops[0]], sinks=lambda ops: [{**ops[0], "parallelism": 2}])
    before_sink = chained(stages=lambda ops: [ops[0], {**mark, "inputs": ["tag"]}],
                          sinks=lambda ops: [{**ops[0], "inputs": ["mark"], "parallelism": 2}])
    assert JobPlan(alone, 0).vertices == ("words",)
    assert {(c.path, c.how) for c in diff(alone, before_sink).changes} == {
        ("spec.stages[mark]", How.LIVE), ("spec.sinks[tagged].inputs", How.LIVE)}


def test_operators_on_workers_of_their_own_come_and_go_live_but_a_stream_never_changes_writers():
    base = chained()
    # between two chains (tag -> count, keyed): on workers of its own, unchained or at another parallelism
    mark = {"name": "mark", "type": "sql", "inputs": ["tag"], "parallelism": 2, "query": "SELECT * FROM input"}
    for extra in ({"chain": False}, {"parallelism": 3}):
        new = chained(stages=lambda ops, extra=extra: [ops[0], {**mark, **extra}, {**ops[1], "inputs": ["mark"]}])
        assert "mark" in JobPlan(new, 0).vertices
        assert not diff(base, new).refused, diff(base, new).lines()
    # inside the chain words -> tag, on workers of its own: tag's stream to count would change writers
    inside = chained(stages=lambda ops: [{**mark, "inputs": ["words"], "chain": False}, {**ops[0], "inputs": ["mark"]},
                                         ops[1]])
    assert {c.path for c in diff(base, inside).refused} == {"spec.stages[tag]"}
    window = {"name": "w", "type": "window_aggregate", "inputs": ["tag"], "keyBy": "word", "parallelism": 2,
              "window": {"type": "tumbling", "sizeMs": 1000}, "aggregations": [{"function": "count", "as": "n"}]}
    sink = {"name": "windows", "type": "console", "inputs": ["w"], "parallelism": 2}
    with_window = chained(stages=lambda ops: [*ops, window], sinks=lambda ops: [*ops, sink])
    changes = diff(base, with_window)
    assert not changes.refused and "its state starts empty at the cut" in next(
        c.reason for c in changes.changes if c.path == "spec.stages[w]")
    (refused,) = diff(with_window, base).refused
    assert refused.path == "spec.stages[w]" and "drop the state it holds" in refused.reason
    # tag leaves the sources' chain: its stream to the sink would be written by tag's workers after the cut
    # and by the sources' before it
    refused = diff(base, edited(base, tag__chain=False)).refused
    assert {(c.path, c.operator) for c in refused} == {("spec.stages[tag]", "tag")}
    assert all("a chain splits or joins another" in c.reason for c in refused)
    assert {c.path for c in diff(edited(base, tag__chain=False), base).refused} == {"spec.stages[tag]"}


def test_a_join_keeps_its_inputs_unless_its_state_is_reset():
    base = load_job(JOBS / "q8-join.yaml")
    swapped = edited(base, **{"new-users__inputs": ["sellers", "persons"]})
    (refused,) = diff(base, swapped).refused
    assert refused.path == "spec.stages[new-users].inputs" and "kept per side" in refused.reason
    assert not diff(base, swapped, reset=("new-users",)).refused


def test_an_added_stage_runs_at_its_chains_running_parallelism():
    store = MemoryJobStore()
    store.deploy(JobPlan(chained(), 1000))
    mark = {"name": "mark", "type": "sql", "inputs": ["words"], "parallelism": 4, "query": "SELECT * FROM input"}
    wanted = chained(stages=lambda ops: [mark, {**ops[0], "inputs": ["mark"], "parallelism": 4}, *ops[1:]],
                     sources=lambda ops: [{**ops[0], "parallelism": 4}])
    controller = ReconfigureController(store, sleep=lambda _: [
        store.record_versions(None, op, range(store.plan().key_groups(op)), 1) for op in store.plan().vertices])
    changes, _ = controller.apply(wanted)
    published = store.plan()
    assert published.chain("words").operators == ("words", "mark", "tag")
    assert published.spec.operator("mark").parallelism == 2
    assert {c.operator for c in changes.rescales} == {"words", "tag"}


def test_parallelism_is_a_rescale_and_a_sink_added_beside_others_is_live():
    base = job()
    changes = diff(base, edited(base, count__parallelism=3))
    assert [(c.path, c.how, c.operator) for c in changes.changes] == [
        ("spec.stages[count].parallelism", How.RESCALE, "count")]
    data = base.model_dump(mode="json", by_alias=True)
    data["spec"]["sinks"].append({"name": "more", "type": "console", "inputs": ["tag"]})
    (added,) = diff(base, type(base).model_validate(data)).changes
    assert (added.path, added.how, added.reason) == ("spec.sinks[more]", How.LIVE, "added at the cut")


def test_a_reset_state_lets_what_the_state_depends_on_change_live():
    base = job()
    new = edited(base, count__keyBy="tag", count__window={"type": "tumbling", "sizeMs": 5000})
    assert [c.path for c in diff(base, new).refused] == ["spec.stages[count].keyBy", "spec.stages[count].window"]
    assert "--reset-state count" in diff(base, new).refused[0].reason
    changes = diff(base, new, reset=("count",))
    assert not changes.refused and {c.path for c in changes.live} == {
        "spec.stages[count]", "spec.stages[count].keyBy", "spec.stages[count].window"}
    assert diff(base, base, reset=("count",)).live, "a reset alone is a change"
    for name in ("tag", "nope"):  # stateless, unknown
        (refused,) = diff(base, base, reset=(name,)).refused
        assert refused.path == f"spec.stages[{name}]" and "stateful stage" in refused.reason


def test_a_reset_travels_with_its_plan_version_and_its_stage_aligns():
    store = MemoryJobStore()
    plan = deployed(store)
    controller = ReconfigureController(store, sleep=lambda _: [
        store.record_versions(None, op, range(plan.key_groups(op)), 1) for op in plan.vertices])
    controller.apply(edited(job(), count__window={"type": "tumbling", "sizeMs": 5000}), reset=("count",))
    published = store.plan()
    assert published.resets == ("count",) and JobPlan.from_json(published.to_json()) == published
    assert store.plan_version(0).resets == ()
    assert holds_back(store.plan_version(0), published, ("tag",)) and holds_back(
        store.plan_version(0), published, ("count",))
    request = ReconfigureRequest(job().model_dump_json(), "r", ("count",))
    assert ReconfigureRequest.decode(request.encode()) == request


def test_a_stateful_function_may_change_over_the_same_state_schema_only():
    base = load_job(JOBS / "new-bidders.yaml")
    assert diff(base, edited(base, **{"first-bid__function": "tests.jobs.udfs:cents"})).live
    assert diff(base, edited(base, **{"first-bid__stateSchema": "seen long, n long"})).refused


def deployed(store: MemoryJobStore) -> JobPlan:
    plan = JobPlan(job(), 1000)
    store.deploy(plan)
    return plan


def test_the_controller_publishes_the_next_version_and_waits_for_every_key_group():
    store = MemoryJobStore()
    plan = deployed(store)
    switched: list[str] = []

    def sleep(_: float) -> None:  # each tick, one more chain switches all its key groups
        waiting = [op for op in plan.vertices if store.versions(op).get(0) != 1]
        if waiting:
            store.record_versions(None, waiting[0], range(plan.key_groups(waiting[0])), 1)
            store.record_aligned(None, waiting[0], 0, 1, 40.0 * (len(switched) + 1))
            switched.append(waiting[0])

    changes, record = ReconfigureController(store, sleep=sleep).apply(job("reconfigured-v1.yaml"), "r1")
    assert switched == list(plan.vertices)
    assert record.version == 1 and record.request == "r1"
    assert record.pause_ms == 40.0 * len(plan.vertices)
    assert store.plan().version == 1 and store.plan_version(0).job == plan.job
    assert store.plan().spec.operator("tag").query.endswith("'v1' AS tag FROM input")
    assert store.reconfigure_state() is None and store.reconfigure_history() == [record]
    assert len(changes.live) == 3


def test_parallelism_stays_the_running_one_in_the_published_plan():
    store = MemoryJobStore()
    plan = deployed(store)
    wanted = edited(job("reconfigured-v1.yaml"), count__parallelism=4)
    controller = ReconfigureController(store, sleep=lambda _: [
        store.record_versions(None, op, range(plan.key_groups(op)), 1) for op in plan.vertices])
    changes, _ = controller.apply(wanted)
    assert store.plan().spec.operator("count").parallelism == 2
    assert [c.operator for c in changes.rescales] == ["count"]


def test_a_refused_change_publishes_nothing():
    store = MemoryJobStore()
    deployed(store)
    with pytest.raises(Refused, match=r"spec.stages\[count\].window"):
        ReconfigureController(store).apply(edited(job(), count__window={"type": "tumbling", "sizeMs": 4000}))
    assert store.plan().version == 0 and store.reconfigure_state() is None


def test_a_timed_out_reconfiguration_is_resumed_before_the_next():
    store = MemoryJobStore()
    plan = deployed(store)
    clock = iter(range(0, 10_000, 100)).__next__
    with pytest.raises(TimeoutError, match="not switched yet"):
        ReconfigureController(store, timeout_s=1, sleep=lambda _: None, clock=clock).apply(job("reconfigured-v1.yaml"))
    assert store.reconfigure_state().version == 1

    def switch_all(_: float) -> None:
        for op in plan.vertices:
            store.record_versions(None, op, range(plan.key_groups(op)), store.reconfigure_state().version)

    _, record = ReconfigureController(store, sleep=switch_all).apply(
        edited(job("reconfigured-v1.yaml"), tag__simulatedCostUs=5))
    assert [r.version for r in store.reconfigure_history()] == [1, 2]
    assert record.version == 2


def test_a_restarted_instance_runs_the_version_its_key_groups_switched_to():
    store = MemoryJobStore()
    plan = deployed(store)
    for op in plan.vertices:
        store.record_versions(None, op, range(plan.key_groups(op)), 1)
    ReconfigureController(store).apply(job("reconfigured-v1.yaml"))
    latest = store.plan()
    assert plan_in_force(store, latest, "count", (0, 1, 2)).version == 1
    store.record_versions(None, "count", (3, 4, 5), 0)  # this instance had not switched yet
    assert plan_in_force(store, latest, "count", (3, 4, 5)).job == plan.job
    with pytest.raises(RuntimeError, match="plan versions"):
        plan_in_force(store, latest, "count", (2, 3))


def test_a_barrier_round_trips_with_its_producers_key_groups():
    entry = decode(encode_barrier(3, [(0, 5), (9, 9)]))
    assert (entry.barrier, entry.runs, entry.records, entry.marker) == (3, ((0, 5), (9, 9)), 0, None)


def test_an_external_record_takes_the_version_of_the_last_cut_its_entry_follows():
    from streamjobs.oracle import Unverifiable, _versions_of

    cuts = [{("in", 0): b"1700-3"}, {("in", 0): b"1800-0"}]
    ids = [b"1699-9", b"1700-3", b"1700-4", b"1800-0", b"1800-1", b"2000-0"]
    assert _versions_of(ids, 0, "in", cuts) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(Unverifiable, match="partition 1 never switched to plan version 1"):
        _versions_of(ids, 1, "in", cuts)
    # a source added live in version 3: under it from its first record, then the cuts of the versions after
    assert _versions_of(ids, 0, "in", [], first=3) == [3] * 6
    assert _versions_of(ids, 0, "in", cuts[:1], first=3) == [3, 3, 4, 4, 4, 4]
    with pytest.raises(Unverifiable, match="partition 1 never switched to plan version 4"):
        _versions_of(ids, 1, "in", cuts, first=3)


def test_only_operators_at_or_upstream_of_a_change_hold_back_after_their_barriers():
    old = JobPlan(job(), 0)
    swapped = JobPlan(edited(job(), tag__query="SELECT word, event_time, 'v1' AS tag FROM input"), 0, 1)
    holding = {op: holds_back(old, swapped, (op,)) for op in ("words", "tag", "count", "tagged", "counts")}
    assert holding == {"words": True, "tag": True, "count": False, "tagged": False, "counts": False}
    asked = JobPlan(job(), 0, 1, ControlEvent("e", "count", "load", {}))
    assert [op for op in ("words", "tag", "count", "tagged", "counts") if holds_back(old, asked, (op,))] == [
        "words", "tag", "count"]
    batching = JobPlan(edited(job(), batching__maxWaitMs=7), 0, 1)
    assert not any(holds_back(old, batching, (op,)) for op in ("words", "tag", "count", "tagged", "counts"))



def test_a_chain_that_gains_or_loses_a_member_holds_back_and_what_it_feeds_does_not_change():
    mark = {"name": "mark", "type": "sql", "inputs": ["words"], "parallelism": 2, "query": "SELECT * FROM input"}
    without = JobPlan(chained(), 0)
    with_mark = JobPlan(chained(stages=lambda ops: [mark, {**ops[0], "inputs": ["mark"]}, *ops[1:]]), 0, 1)
    for old, new in ((without, with_mark), (with_mark, JobPlan(chained(), 0, 2))):
        holding = {chain.head: holds_back(old, new, chain.operators) for chain in old.chains}
        assert holding == {"words": True, "count": False, "tagged": False, "counts": False}, holding


def test_a_consumer_switches_to_the_new_tails_streams_with_their_watermarks_and_drops_the_old():
    mark = {"name": "mark", "type": "sql", "inputs": ["tag"], "parallelism": 2, "query": "SELECT * FROM input"}
    old = JobPlan(chained(), 0)  # words -> tag, one chain; count reads tag's streams
    new = JobPlan(chained(stages=lambda ops: [ops[0], mark, {**ops[1], "inputs": ["mark"]}],
                          sinks=lambda ops: [{**ops[0], "inputs": ["mark"]}, ops[1]]), 0, 1)
    assert not diff(old.job, new.job).refused
    gone = [old.keys.kg_stream("tag", "count", kg) for kg in (3, 4)]
    taken = [new.keys.kg_stream("mark", "count", kg) for kg in (3, 4)]
    jobs = MemoryJobStore()
    exchange = MemoryExchange(jobs, old.keys)
    jobs.record_streams(None, "count", {name: (b"12-0", ((0, 1, 4000),)) for name in gone})
    reader = StreamInput(exchange, jobs, old, "count", 0, (3, 4))
    for stream in reader._streams.values():  # read up to their barriers, not committed yet
        stream.upstream_watermarks[:] = 5000
        stream.cursor, stream.read_records, stream.changed = b"17-0", 9, True
    txn = Transaction()
    reader.switch(new, txn)
    reader.add_progress(txn)
    assert jobs.streams("count", gone) == [(b"12-0", ((0, 1, 4000),))] * 2  # until the switch commits
    exchange.commit(txn, Fence("count", 0, jobs.new_incarnation("count", 0)))
    assert jobs.streams("count", gone) == [(None, None)] * 2
    assert [cursor for cursor, _ in jobs.streams("count", taken)] == [b"0-0"] * 2
    assert reader.key_group_watermarks() == {3: 5000, 4: 5000} and reader.version == 1
    assert sorted(txn.hincrs) == [(old.keys.consumed("tag", "count"), str(kg), 9) for kg in (3, 4)]


def test_a_consumer_fed_by_a_new_chain_reads_its_streams_from_no_watermark_and_its_version():
    mark = {"name": "mark", "type": "sql", "inputs": ["tag"], "parallelism": 3, "query": "SELECT * FROM input"}
    old = JobPlan(chained(), 0)
    new = JobPlan(chained(stages=lambda ops: [ops[0], mark, {**ops[1], "inputs": ["mark"]}]), 0, 1)
    assert "mark" in new.vertices and not diff(old.job, new.job).refused
    jobs = MemoryJobStore()
    reader = StreamInput(None, jobs, old, "count", 0, (3, 4))
    for stream in reader._streams.values():
        stream.upstream_watermarks[:] = 5000
    reader.switch(new, Transaction())
    assert sorted(reader._streams) == [new.keys.kg_stream("mark", "count", kg) for kg in (3, 4)]
    assert all(int(s.passed.min()) == 1 and len(s.passed) == new.key_groups("mark") for s in reader._streams.values())
    assert reader.key_group_watermarks() == {3: MIN_WATERMARK, 4: MIN_WATERMARK}


class _Fleet:
    """Records what the controller asks of the fleet, and what the store held at that moment."""

    def __init__(self, store: MemoryJobStore) -> None:
        self.store = store
        self.calls: list[tuple] = []

    def start_chain(self, op: str, parallelism: int) -> None:
        prepared = self.store.plan_version(self.store.plan().version + 1)
        self.calls.append(("start", op, parallelism, self.store.plan().version, prepared is not None and
                           op in prepared.vertices, set(self.store.versions(op).values()),
                           plan_for(self.store, op).version))

    def stop_chain(self, op: str) -> None:
        self.calls.append(("stop", op, self.store.plan().version, set(self.store.versions(op).values())))


def test_a_chain_added_is_prepared_and_started_before_the_sources_switch_and_one_removed_stopped_after():
    store = MemoryJobStore()
    store.deploy(JobPlan(chained(), 1000))
    fleet = _Fleet(store)
    def switch_all(_) -> None:  # every instance of every chain, the removed ones too, passes the barriers
        latest = store.plan()
        for plan in (latest, store.plan_version(latest.version - 1)):
            for op in plan.vertices:
                store.record_versions(None, op, range(plan.key_groups(op)), latest.version)

    controller = ReconfigureController(store, fleet=fleet, sleep=switch_all)
    mark = {"name": "mark", "type": "sql", "inputs": ["tag"], "parallelism": 3, "query": "SELECT * FROM input"}
    controller.apply(chained(stages=lambda ops: [ops[0], mark, {**ops[1], "inputs": ["mark"]}]))
    # started on the prepared version 1 while version 0 was in force, its key groups at 1 already
    assert fleet.calls == [("start", "mark", 3, 0, True, {1}, 1)]
    assert store.plan().version == 1 and store.plan().spec.operator("mark").parallelism == 3
    assert [p.version for p in store.plans()] == [0, 1] and plan_for(store, "mark").version == 1
    assert store.assignment("mark").parallelism == 3
    controller.apply(chained())
    assert fleet.calls[1:] == [("stop", "mark", 2, {2})]  # after it passed version 2 on
    assert plan_for(store, "mark").version == 1  # a restarted instance finds the last plan with it


def test_a_removal_waits_for_the_removed_chains_key_groups():
    store = MemoryJobStore()
    mark = {"name": "mark", "type": "sql", "inputs": ["tag"], "parallelism": 3, "query": "SELECT * FROM input"}
    with_mark = JobPlan(chained(stages=lambda ops: [ops[0], mark, {**ops[1], "inputs": ["mark"]}]), 1000)
    store.deploy(with_mark)
    store.publish_plan(JobPlan(chained(), 1000, 1), ReconfigureState(1, 0.0, ()))
    controller = ReconfigureController(store)
    for op in store.plan().vertices:
        store.record_versions(None, op, range(store.plan().key_groups(op)), 1)
    assert controller.waiting(store.plan()) == {"mark": 12}
    store.record_versions(None, "mark", range(12), 1)
    assert controller.waiting(store.plan()) == {}


def test_a_redis_stream_source_is_added_live_and_a_generator_refused():
    base = job()
    data = base.model_dump(mode="json", by_alias=True)
    data["spec"]["sources"].append({"name": "extra", "type": "redis_stream", "partitions": 2})
    data["spec"]["sinks"].append({"name": "extras", "type": "redis_stream", "inputs": ["extra"]})
    changes = diff(base, type(base).model_validate(data))
    assert not changes.refused and {c.path for c in changes.live} == {"spec.sources[extra]", "spec.sinks[extras]"}
    assert not diff(type(base).model_validate(data), base).refused, "and removed"
    data["spec"]["sources"][-1] = {**data["spec"]["sources"][0], "name": "extra"}
    (refused,) = diff(base, type(base).model_validate(data)).refused
    assert refused.path == "spec.sources[extra]" and "event time runs from the job's start" in refused.reason


def test_the_run_prints_each_change_with_its_operator_named():
    import io

    from rich.console import Console
    from streamjobs.run import _tick
    from streamjobs_core.control import ReconfigureRecord

    class Runtime:
        plan = JobPlan(job(), 0)

        def supervise(self):
            return []

        def resume_rescale(self):
            return None

        def handle_requests(self):
            return [ReconfigureRecord(3, ("spec.sinks[retagged]: live (added at the cut)",), None, 1.5, 20.0, {})]

        def drained(self):
            return False

    out = io.StringIO()
    autoscaler = type("Autoscaler", (), {"tick": lambda self: None, "follow": lambda self, topology: None})()
    _tick(Runtime(), Console(file=out, width=200), autoscaler)
    assert "spec.sinks[retagged]: live (added at the cut)" in out.getvalue()


def test_a_chain_whose_workers_do_not_start_leaves_the_job_as_it_was():
    store = MemoryJobStore()
    store.deploy(JobPlan(chained(), 1000))
    fleet = _Fleet(store)

    def fail(op: str, parallelism: int) -> None:
        raise TimeoutError(f"workers not ready: {op}")

    fleet.start_chain = fail
    mark = {"name": "mark", "type": "sql", "inputs": ["tag"], "parallelism": 3, "query": "SELECT * FROM input"}
    with pytest.raises(TimeoutError):
        ReconfigureController(store, fleet=fleet).apply(
            chained(stages=lambda ops: [ops[0], mark, {**ops[1], "inputs": ["mark"]}]))
    assert fleet.calls == [("stop", "mark", 0, {1})]  # stopped, then what was prepared for it goes
    assert store.plan().version == 0 and store.plan_version(1) is None and [p.version for p in store.plans()] == [0]
    assert store.assignment("mark") is None and store.reconfigure_state() is None
