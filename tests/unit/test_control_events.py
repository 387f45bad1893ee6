"""Control events (Chi): the records, the controller that sends one as a plan version, and the worker's handlers."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from streamjobs_core.control import ControlEvent, ControlRecord
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.loading import SpecError, parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.reconfigure import How, ReconfigureController, diff
from streamjobs_core.spec import BUILT_IN_HANDLERS
from streamjobs_worker import controlhandlers
from streamjobs_worker.controlhandlers import ControlContext
from streamjobs_worker.state import KeyGroupStore, StateLayout

from .test_reconfigure import deployed, job

pytestmark = pytest.mark.unit

HANDLERS = {"echo": "tests.jobs.handlers:echo", "fail": "tests.jobs.handlers:fail"}


def event(name: str = "echo", operator: str = "count", **args: str) -> ControlEvent:
    return ControlEvent(f"id-{name}", operator, name, args)


def test_an_event_and_its_record_round_trip_and_travel_in_the_plan():
    sent = event(who="me")
    record = ControlRecord(sent, 3, {"count/0": {"a": 1}}, 0.5, 12.0)
    assert ControlRecord.decode(record.encode()) == record
    plan = JobPlan(job(), 7, 3, sent)
    assert JobPlan.from_json(plan.to_json()) == plan
    assert JobPlan.from_json(JobPlan(job(), 7, 4).to_json()).control is None


def test_handlers_are_named_in_the_spec_and_change_live():
    data = job().model_dump(mode="json", by_alias=True)
    data["spec"]["controlHandlers"] = HANDLERS
    changed = parse_job(data)
    assert {(c.path, c.how) for c in diff(job(), changed).changes} == {
        ("spec.controlHandlers.echo", How.LIVE), ("spec.controlHandlers.fail", How.LIVE)}
    for handlers, message in (({"load": "m:f"}, "'load' is a built-in handler"),
                              ({"Bad": "m:f"}, "must match"), ({"ok": "nomodule"}, "'ok': must name")):
        data["spec"]["controlHandlers"] = handlers
        with pytest.raises(SpecError, match=message) as raised:
            parse_job(data)
        assert raised.value.errors[0][0] == "spec.controlHandlers"


def test_the_controller_sends_an_event_as_a_version_with_the_same_spec_and_gathers_replies():
    store = MemoryJobStore()
    plan = deployed(store)

    def sleep(_: float) -> None:  # every instance of every chain switches; count's instances reply
        for op in plan.vertices:
            store.record_versions(None, op, range(plan.key_groups(op)), 1)
        for instance in (0, 1):
            store.record_reply(None, "id-load", "count", instance, json.dumps({"records": {str(instance): 5}}))

    record = ReconfigureController(store, sleep=sleep).deliver(event("load"))
    assert record.version == 1 and store.plan().job == plan.job and store.plan().control == event("load")
    assert record.replies == {"count/0": {"records": {"0": 5}}, "count/1": {"records": {"1": 5}}}
    assert store.control_history() == [record]
    assert [r.changes for r in store.reconfigure_history()] == [("control load -> count",)]


def test_an_unknown_operator_or_handler_is_refused_and_nothing_is_sent():
    store = MemoryJobStore()
    deployed(store)
    controller = ReconfigureController(store)
    assert "no operator 'nope'" in controller.deliver(event(operator="nope")).refused
    refused = controller.deliver(event("flush")).refused
    assert "no handler for event 'flush'" in refused and "load, state" in refused
    assert store.plan().version == 0 and store.reconfigure_state() is None


def test_a_resumed_controller_records_the_replies_of_an_event_a_dead_one_sent():
    store = MemoryJobStore()
    plan = deployed(store)
    clock = iter(range(0, 10_000, 100)).__next__
    with pytest.raises(TimeoutError):
        ReconfigureController(store, timeout_s=1, sleep=lambda _: None, clock=clock).deliver(event("state"))
    for op in plan.vertices:
        store.record_versions(None, op, range(plan.key_groups(op)), 1)
    store.record_reply(None, "id-state", "count", 0, json.dumps({"rows": {}}))
    ReconfigureController(store).resume()
    assert [r.event for r in store.control_history()] == [event("state")]


def context(store: KeyGroupStore | None = None, **fields) -> ControlContext:
    values = {"operator": "count", "instance": 1, "version": 4, "args": {"k": "v"}, "key_groups": (6, 7),
              "watermarks": {6: 10, 7: 12}, "records": {6: 30, 7: 12}, "offsets": {}, "_store": store} | fields
    return ControlContext(**values)


def test_built_in_handlers_answer_load_and_state_and_are_those_the_spec_knows():
    assert set(controlhandlers.BUILT_IN) == set(BUILT_IN_HANDLERS)
    plan = JobPlan(job(), 0, 4, event("load"))
    assert json.loads(controlhandlers.reply(event("load"), plan, context())) == {"records": {"6": 30, "7": 12}}
    source = context(key_groups=(0,), records={}, offsets={0: "1500"})
    assert json.loads(controlhandlers.reply(event("load"), plan, source)) == {"offsets": {"0": "1500"}}
    store = KeyGroupStore((6, 7))
    store.bind(StateLayout(key="word"))
    store.load(6, pa.table({"word": ["a", "b"], "n": [1, 2]}))
    assert json.loads(controlhandlers.reply(event("state"), plan, context(store))) == {"rows": {"6": 2, "7": 0}}


def test_a_users_handler_answers_and_one_that_raises_replies_with_its_error():
    data = job().model_dump(mode="json", by_alias=True)
    data["spec"]["controlHandlers"] = HANDLERS
    plan = JobPlan(parse_job(data), 0, 4)
    answer = json.loads(controlhandlers.reply(event(who="me"), plan, context()))
    assert answer == {"args": {"k": "v"}, "key_groups": [6, 7], "version": 4, "records": 42}
    assert json.loads(controlhandlers.reply(event("fail"), plan, context())) == {
        "error": "ValueError: asked to fail on instance 1"}
