"""The rescale controller's state machine against a real Redis, with a Fleet that records its calls."""

from __future__ import annotations

import json

import pytest
from streamjobs_core.plan import JobPlan, read_assignment
from streamjobs_core.rescale import HANDOVER, PRESTAGE, RescaleController, RescaleError, progress


class RecordingFleet:
    """Standbys 'start' by registering in Redis the way workers do; a step may be made to fail once."""

    def __init__(self, r, plan: JobPlan, fail_on: str | None = None, standbys_register: bool = True) -> None:
        self.r, self.plan, self.fail_on, self.standbys_register = r, plan, fail_on, standbys_register
        self.calls: list[tuple] = []

    def _call(self, name: str, *args) -> None:
        self.calls.append((name, *args))
        if self.fail_on == name:
            self.fail_on = None
            raise ConnectionError(f"controller died during {name}")

    def start_standbys(self, op, parallelism, epoch):
        self._call("start_standbys", op, parallelism, epoch)
        if self.standbys_register:
            self.r.hset(self.plan.keys.standby(op), mapping={str(i): epoch for i in range(parallelism)})

    def stop_old(self, op, epoch):
        self._call("stop_old", op, epoch)

    def adopt(self, op, parallelism, epoch):
        self._call("adopt", op, parallelism, epoch)

    def discard_standbys(self, op, epoch):
        self._call("discard_standbys", op, epoch)

    def stop_job(self):
        self._call("stop_job")

    def start_job(self, parallelism):
        self._call("start_job", parallelism)


def test_all_at_once_goes_prestage_handover_retire_and_records_history(r, plan):
    fleet = RecordingFleet(r, plan)
    record = RescaleController(r, plan, fleet).rescale("agg", 4, "all_at_once")
    assert [c[0] for c in fleet.calls] == ["start_standbys", "stop_old", "adopt"]
    assignment = read_assignment(r, plan.keys, "agg")
    assert (assignment.epoch, assignment.parallelism) == (2, 4)
    assert record["moved_key_groups"] > 0 and record["from"] == 2 and record["to"] == 4
    assert r.get(plan.keys.rescale_current) is None
    assert json.loads(r.lindex(plan.keys.rescale_history, -1))["epoch"] == 2


def test_handover_waits_until_the_standbys_prestaged_state_is_nearly_current(r, plan):
    """Standbys learn their key groups from the upcoming assignment before they start; the old owners
    stop only once every standby's last catch-up round was short."""
    keys, seen = plan.keys, {}
    fleet = RecordingFleet(r, plan)
    rounds = iter([5000, 40])  # a standby still replaying a long changelog, then one near the head

    def start_standbys(op, parallelism, epoch):
        seen["upcoming"] = read_assignment(r, keys, op, upcoming=True)
        RecordingFleet.start_standbys(fleet, op, parallelism, epoch)
        r.hset(keys.standby_lag(op), "1", next(rounds))

    def sleep(_):
        seen.setdefault("progress", progress(r, keys))
        r.hset(keys.standby_lag("agg"), "1", next(rounds, 40))

    def stop_old(op, epoch):
        seen["lag_seen_by_stop"] = int(r.hget(keys.standby_lag(op), "1"))
        RecordingFleet.stop_old(fleet, op, epoch)

    fleet.start_standbys, fleet.stop_old = start_standbys, stop_old
    RescaleController(r, plan, fleet, sleep=sleep).rescale("agg", 4, "all_at_once")
    shown = seen["progress"]  # what `streamjobs status` and the StreamJob's status show meanwhile
    assert (shown["phase"], shown["standbys_ready"], shown["standby_lag"]) == (PRESTAGE, 4, 5000)
    assert seen["upcoming"] == read_assignment(r, keys, "agg")  # what the standbys prestaged is what switched
    assert seen["lag_seen_by_stop"] <= plan.spec.rescale.prestage_max_lag
    assert not r.exists(keys.next_assignment("agg"), keys.standby_lag("agg"), keys.standby("agg"))


def test_restart_stops_and_starts_the_whole_job(r, plan):
    fleet = RecordingFleet(r, plan)
    RescaleController(r, plan, fleet).rescale("agg", 3, "restart")
    assert fleet.calls == [("stop_job",), ("start_job", {"src": 1, "agg": 3, "out": 1})]


def test_a_controller_that_died_in_handover_is_finished_by_the_next(r, plan):
    fleet = RecordingFleet(r, plan, fail_on="stop_old")
    with pytest.raises(ConnectionError):
        RescaleController(r, plan, fleet).rescale("agg", 1, "all_at_once")
    assert json.loads(r.get(plan.keys.rescale_current))["phase"] == HANDOVER
    assert read_assignment(r, plan.keys, "agg").epoch == 1  # nothing switched yet

    record = RescaleController(r, plan, fleet).resume()
    assert [c[0] for c in fleet.calls] == ["start_standbys", "stop_old", "stop_old", "adopt"]
    assert read_assignment(r, plan.keys, "agg").parallelism == 1 and record["epoch"] == 2
    assert r.get(plan.keys.rescale_current) is None


def test_a_controller_that_died_after_the_switch_does_not_switch_twice(r, plan):
    fleet = RecordingFleet(r, plan, fail_on="adopt")
    with pytest.raises(ConnectionError):
        RescaleController(r, plan, fleet).rescale("agg", 4, "all_at_once")
    assert read_assignment(r, plan.keys, "agg").epoch == 2
    record = RescaleController(r, plan, fleet).resume()
    assert read_assignment(r, plan.keys, "agg").epoch == 2 and record["to"] == 4
    assert record["moved_key_groups"] > 0


def test_prestage_that_never_gets_ready_rolls_back_and_leaves_the_job_as_it_was(r, plan):
    fleet = RecordingFleet(r, plan, standbys_register=False)
    controller = RescaleController(r, plan, fleet, standby_timeout_s=0.3)
    with pytest.raises(RescaleError, match="standby"):
        controller.rescale("agg", 4, "all_at_once")
    assert fleet.calls == [("start_standbys", "agg", 4, 2), ("discard_standbys", "agg", 2)]
    assert read_assignment(r, plan.keys, "agg").epoch == 1
    assert controller.current() is None and controller.history() == []


def test_resume_in_prestage_rolls_back(r, plan):
    r.set(plan.keys.rescale_current, json.dumps(
        {"operator": "agg", "from": 2, "to": 4, "strategy": "all_at_once", "epoch": 2, "phase": PRESTAGE}))
    fleet = RecordingFleet(r, plan)
    assert RescaleController(r, plan, fleet).resume()["phase"] == "ROLLED_BACK"
    assert fleet.calls == [("discard_standbys", "agg", 2)] and read_assignment(r, plan.keys, "agg").epoch == 1


def test_bad_requests_change_nothing(r, plan):
    controller = RescaleController(r, plan, RecordingFleet(r, plan))
    with pytest.raises(KeyError):
        controller.rescale("nope", 2)
    with pytest.raises(RescaleError, match="strategy"):
        controller.rescale("agg", 2, "sideways")
    with pytest.raises(RescaleError, match=">= 1"):
        controller.rescale("agg", 0)
    assert controller.current() is None and read_assignment(r, plan.keys, "agg").epoch == 1


def test_status_command_shows_the_rescale_in_progress_and_its_standbys(r, plan, redis_server, capsys):
    from streamjobs.cli import main

    r.set(plan.keys.plan, plan.to_json())
    state = {"operator": "agg", "from": 2, "to": 3, "strategy": "all_at_once", "epoch": 2, "phase": PRESTAGE}
    r.set(plan.keys.rescale_current, json.dumps(state))
    r.hset(plan.keys.standby("agg"), mapping={"0": 2, "1": 2})
    r.hset(plan.keys.standby_lag("agg"), mapping={"0": 12, "1": 340})
    assert main(["status", "--job", "ctl", "--redis-url", redis_server.url]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["operators"]["agg"] == {"parallelism": 2, "epoch": 1}
    assert shown["rescale_in_progress"] == {**state, "standbys_ready": 2, "standby_lag": 340}

