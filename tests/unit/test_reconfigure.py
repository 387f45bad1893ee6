"""Live reconfiguration's control side: what may change live, and the controller's wait for every key group."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamjobs_core.codec import decode, encode_barrier
from streamjobs_core.control import ControlEvent, ReconfigureRequest
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.loading import load_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.reconfigure import How, ReconfigureController, Refused, diff, holds_back, plan_in_force

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
    ("count__inputs", ["words"], "graph"),
    ("tag__chain", True, "graph"),
    ("state__backend", "rocksdb", "where the state lives"),
    ("spec__maxParallelism", 24, "re-split"),
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


def test_parallelism_is_a_rescale_and_adding_an_operator_is_refused():
    base = job()
    changes = diff(base, edited(base, count__parallelism=3))
    assert [(c.path, c.how, c.operator) for c in changes.changes] == [
        ("spec.stages[count].parallelism", How.RESCALE, "count")]
    data = base.model_dump(mode="json", by_alias=True)
    data["spec"]["sinks"].append({"name": "more", "type": "console", "inputs": ["tag"]})
    refused = diff(base, type(base).model_validate(data)).refused
    assert [c.path for c in refused] == ["spec.sinks[more]"] and "adding" in refused[0].reason


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

