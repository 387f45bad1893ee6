"""The rescale controller and the controller's side of the handover, against the in-memory job store: fleets
that record their calls, and workers played by the test through the same store records workers write."""

from __future__ import annotations

import pytest
from streamjobs_core import handover
from streamjobs_core.control import Phase, RescaleState, Strategy
from streamjobs_core.exchange import Fence, MemoryExchange, Transaction
from streamjobs_core.jobstore import MemoryJobStore
from streamjobs_core.keygroups import Move
from streamjobs_core.rescale import RescaleController, RescaleError, progress

from ..jobs.control import control_plan


@pytest.fixture
def plan():
    return control_plan()


@pytest.fixture
def store(plan):
    store = MemoryJobStore()
    store.deploy(plan)
    return store


class RecordingFleet:
    """Standbys 'start' by reporting ready the way workers do; a step may be made to fail once."""

    def __init__(self, store, fail_on: str | None = None, standbys_register: bool = True) -> None:
        self.store, self.fail_on, self.standbys_register = store, fail_on, standbys_register
        self.calls: list[tuple] = []

    def _call(self, name: str, *args) -> None:
        self.calls.append((name, *args))
        if self.fail_on == name:
            self.fail_on = None
            raise ConnectionError(f"controller died during {name}")

    def start_standbys(self, op, parallelism, epoch):
        self._call("start_standbys", op, parallelism, epoch)
        if self.standbys_register:
            for i in range(parallelism):
                self.store.report_standby(op, i, epoch)

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


def test_all_at_once_goes_prestage_handover_retire_and_records_history(store, plan):
    fleet = RecordingFleet(store)
    record = RescaleController(store, plan, fleet).rescale("agg", 4, "all_at_once")
    assert [c[0] for c in fleet.calls] == ["start_standbys", "stop_old", "adopt"]
    assignment = store.assignment("agg")
    assert (assignment.epoch, assignment.parallelism) == (2, 4)
    assert record.moved_key_groups > 0 and (record.from_parallelism, record.to_parallelism) == (2, 4)
    assert store.rescale_state() is None and store.rescale_history() == [record]
    assert store.generation("agg") == 2  # a revoking rescale fences the old instances' commits


def test_handover_waits_until_the_standbys_prestaged_state_is_nearly_current(store, plan):
    """Standbys learn their key groups from the upcoming assignment before they start; the old owners
    stop only once every standby's last catch-up round was short."""
    seen = {}
    fleet = RecordingFleet(store)
    rounds = iter([5000, 40])  # a standby still replaying a long changelog, then one near the head

    def start_standbys(op, parallelism, epoch):
        seen["upcoming"] = store.upcoming_assignment(op)
        RecordingFleet.start_standbys(fleet, op, parallelism, epoch)
        store.report_standby_lag(op, 1, next(rounds))

    def sleep(_):
        seen.setdefault("progress", progress(store))
        store.report_standby_lag("agg", 1, next(rounds, 40))

    def stop_old(op, epoch):
        seen["lag_seen_by_stop"] = {s.instance: s.lag for s in store.standbys(op)}[1]
        RecordingFleet.stop_old(fleet, op, epoch)

    fleet.start_standbys, fleet.stop_old = start_standbys, stop_old
    RescaleController(store, plan, fleet, sleep=sleep).rescale("agg", 4, "all_at_once")
    shown = seen["progress"]  # what `streamjobs status` and the StreamJob's status show meanwhile
    assert (shown["phase"], shown["standbys_ready"], shown["standby_lag"]) == ("PRESTAGE", 4, 5000)
    assert seen["upcoming"] == store.assignment("agg")  # what the standbys prestaged is what switched
    assert seen["lag_seen_by_stop"] <= plan.spec.rescale.prestage_max_lag
    assert store.upcoming_assignment("agg") is None and store.standbys("agg") == []


def test_restart_stops_and_starts_the_whole_job(store, plan):
    fleet = RecordingFleet(store)
    RescaleController(store, plan, fleet).rescale("agg", 3, Strategy.RESTART)
    assert fleet.calls == [("stop_job",), ("start_job", {"src": 1, "agg": 3, "out": 1})]


def test_a_controller_that_died_in_handover_is_finished_by_the_next(store, plan):
    fleet = RecordingFleet(store, fail_on="stop_old")
    with pytest.raises(ConnectionError):
        RescaleController(store, plan, fleet).rescale("agg", 1, "all_at_once")
    assert store.rescale_state().phase == Phase.HANDOVER
    assert store.assignment("agg").epoch == 1  # nothing switched yet

    record = RescaleController(store, plan, fleet).resume()
    assert [c[0] for c in fleet.calls] == ["start_standbys", "stop_old", "stop_old", "adopt"]
    assert store.assignment("agg").parallelism == 1 and record.epoch == 2
    assert store.rescale_state() is None


def test_a_controller_that_died_after_the_switch_does_not_switch_twice(store, plan):
    fleet = RecordingFleet(store, fail_on="adopt")
    with pytest.raises(ConnectionError):
        RescaleController(store, plan, fleet).rescale("agg", 4, "all_at_once")
    assert store.assignment("agg").epoch == 2
    record = RescaleController(store, plan, fleet).resume()
    assert store.assignment("agg").epoch == 2 and record.to_parallelism == 4
    assert record.moved_key_groups > 0


def test_prestage_that_never_gets_ready_rolls_back_and_leaves_the_job_as_it_was(store, plan):
    fleet = RecordingFleet(store, standbys_register=False)
    clock = iter(range(0, 10_000, 1)).__next__  # a second per look: the timeout passes without sleeping
    controller = RescaleController(store, plan, fleet, standby_timeout_s=3, clock=clock, sleep=lambda _: None)
    with pytest.raises(RescaleError, match="standby"):
        controller.rescale("agg", 4, "all_at_once")
    assert fleet.calls == [("start_standbys", "agg", 4, 2), ("discard_standbys", "agg", 2)]
    assert store.assignment("agg").epoch == 1 and store.upcoming_assignment("agg") is None
    assert controller.current() is None and controller.history() == []


def test_resume_in_prestage_rolls_back(store, plan):
    store.save_rescale(RescaleState("agg", 2, 4, Strategy.ALL_AT_ONCE, 2, Phase.PRESTAGE, 0.0))
    fleet = RecordingFleet(store)
    record = RescaleController(store, plan, fleet).resume()
    assert record.rolled_back and record.parallelism == 2
    assert fleet.calls == [("discard_standbys", "agg", 2)] and store.assignment("agg").epoch == 1


def test_bad_requests_change_nothing(store, plan):
    controller = RescaleController(store, plan, RecordingFleet(store))
    with pytest.raises(KeyError):
        controller.rescale("nope", 2)
    with pytest.raises(RescaleError, match="unknown rescale strategy 'sideways'"):
        controller.rescale("agg", 2, "sideways")
    with pytest.raises(RescaleError, match=">= 1"):
        controller.rescale("agg", 0)
    assert controller.current() is None and store.assignment("agg").epoch == 1


def test_the_fault_hook_sees_each_wait_and_can_kill_the_controller_there(store, plan):
    seen = []

    def die_in_handover(state):
        seen.append(state.phase)
        if state.phase == Phase.HANDOVER:
            raise ConnectionError("injected")

    fleet = Workers(store)
    with pytest.raises(ConnectionError, match="injected"):
        RescaleController(store, plan, fleet, sleep=fleet.sleep, on_wait=die_in_handover).rescale("agg", 3, "fluid")
    assert seen[-1] == Phase.HANDOVER and store.rescale_state().phase == Phase.HANDOVER
    workers = Workers(store)
    record = RescaleController(store, plan, workers, sleep=workers.sleep).resume()
    assert record.to_parallelism == 3 and store.assignment("agg").parallelism == 3


# --- fluid and batched: the controller's side of the per-key-group handover ------------


class Workers:
    """Stands in for the workers of `agg`: at each sleep of the controller, every key group whose markers
    went in is released and taken over, through the store records workers write. `die_after` sleeps, the
    controller 'dies' once."""

    def __init__(self, store, die_after: int | None = None) -> None:
        self.store, self.die_after = store, die_after
        self.calls: list[tuple] = []
        self.sleeps = 0
        self.moved_so_far: list[int] = []  # what `streamjobs status` showed at each sleep

    def add_instances(self, op, parallelism):
        self.calls.append(("add_instances", op, parallelism))

    def remove_instances(self, op, parallelism):
        self.calls.append(("remove_instances", op, parallelism))

    def sleep(self, _seconds: float) -> None:
        self.sleeps += 1
        if self.die_after is not None and self.sleeps > self.die_after:
            self.die_after = None
            raise ConnectionError("controller died between steps")
        self.moved_so_far.append(progress(self.store)["key_groups_moved"])
        for _, op, kg, target in self.store.markers:
            self.store.release_in(None, op, {kg: target})
            self.store.record_acquired(op, [kg], target)
        for kg, target in self.store.release_requests("agg").items():
            self.store.release_in(None, "agg", {kg: target})
            self.store.record_acquired("agg", [kg], target)


def marked(store) -> dict[int, int]:
    """Markers placed per key group."""
    out: dict[int, int] = {}
    for _, _, kg, _ in store.markers:
        out[kg] = out.get(kg, 0) + 1
    return out


def test_fluid_moves_one_key_group_per_step_then_switches_in_the_same_generation(store, plan):
    fleet = Workers(store)
    record = RescaleController(store, plan, fleet, sleep=fleet.sleep).rescale("agg", 3, "fluid")
    assignment = store.assignment("agg")
    assert (assignment.epoch, assignment.parallelism) == (2, 3)
    assert store.generation("agg") == 1  # running instances go on committing
    assert record.moved_key_groups == record.steps == 6  # 4, 5 -> 1; 8..11 -> 2
    assert marked(store) == {4: 1, 5: 1, 8: 1, 9: 1, 10: 1, 11: 1}
    assert fleet.calls == [("add_instances", "agg", 3), ("remove_instances", "agg", 3)]
    assert fleet.moved_so_far == list(range(6))
    assert store.ownership("agg")[1] == {} and store.acquired("agg") == {} and store.rescale_state() is None


def test_batched_scale_in_resumed_after_the_controller_died_mid_steps(store, plan):
    first = Workers(store)
    RescaleController(store, plan, first, sleep=first.sleep).rescale("agg", 4, "fluid")
    store.markers.clear()
    dying = Workers(store, die_after=1)
    with pytest.raises(ConnectionError):
        RescaleController(store, plan, dying, sleep=dying.sleep).rescale("agg", 2, "batched")
    assert store.rescale_state().phase == Phase.HANDOVER
    fleet = Workers(store)
    record = RescaleController(store, plan, fleet, sleep=fleet.sleep).resume()
    assert (record.from_parallelism, record.to_parallelism, record.moved_key_groups, record.steps) == (4, 2, 9, 2)
    assert store.assignment("agg").owners == (0,) * 6 + (1,) * 6
    assert fleet.calls == [("remove_instances", "agg", 2)]
    assert all(n <= 2 for n in marked(store).values())  # a step already done is not marked again


def test_a_source_partition_is_asked_for_its_release_not_marked(store, plan):
    assert handover.start(store, plan, "src", [Move(0, 0, 1)]) == [0]
    assert store.release_requests("src") == {0: 1} and store.markers == []


def test_a_backlogged_owner_is_asked_for_a_release_and_the_others_get_markers():
    plan = control_plan(markerMaxLagRecords=5)
    store = MemoryJobStore()
    store.deploy(plan)
    txn = Transaction()  # instance 0 owns key groups 0..5: six records behind in all
    txn.hincrby(plan.keys.produced("src", "agg"), "1", 6)
    MemoryExchange(store, plan.keys).commit(txn, Fence("src", 0, store.new_incarnation("src", 0)))
    assert handover.start(store, plan, "agg", [Move(3, 0, 1), Move(9, 1, 0)]) == [3]
    assert store.release_requests("agg") == {3: 1}
    assert store.markers == [("src", "agg", 9, 0)]


def test_a_step_is_complete_once_both_owners_said_so(store):
    step = [Move(3, 0, 1), Move(4, 0, 1)]
    store.release_in(None, "agg", {3: 1, 4: 1})
    store.record_acquired("agg", [3], 1)
    assert not handover.completed(store, "agg", step)  # 4 released, not taken over yet
    store.record_acquired("agg", [4], 1)
    assert handover.completed(store, "agg", step)


class WatermarksMove(Workers):
    """Workers whose committed watermark (every key group's) advances 100 ms per controller sleep; records
    the committed watermark at which each step's markers were placed."""

    def __init__(self, store) -> None:
        super().__init__(store)
        self.watermark = 1550
        self.marked_at: list[int] = []
        self._commit()

    def sleep(self, seconds: float) -> None:
        if len(self.store.markers) > len(self.marked_at):  # fluid: one marker per step (one input)
            self.marked_at.append(self.watermark)
        super().sleep(seconds)
        self.watermark += 100
        self._commit()

    def _commit(self) -> None:
        keys = self.store.plan().keys
        self.store.record_streams(None, "agg", {keys.kg_stream("src", "agg", kg): (b"1-0", ((0, 1, self.watermark),))
                                                for kg in range(12)})


def test_with_short_windows_each_step_starts_right_after_its_key_groups_fired_a_window(store, plan):
    fleet = WatermarksMove(store)
    record = RescaleController(store, plan, fleet, sleep=fleet.sleep).rescale("agg", 3, "fluid")
    assert record.steps == 6
    # 1 s windows: every step's markers went in within 100 ms (one commit) after a window end was committed,
    # one step per window.
    assert [mark // 1000 for mark in fleet.marked_at] == [2, 3, 4, 5, 6, 7]
    assert all(mark % 1000 < 100 for mark in fleet.marked_at), fleet.marked_at
