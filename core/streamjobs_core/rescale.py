"""The rescale controller: one operator's parallelism changes while the job runs.

A rescale is a state machine persisted in Redis (`rescale:current`), so a
controller that restarts anywhere finds where the last one stopped. With
`all_at_once`:

    PRESTAGE  the upcoming assignment is published and the new instances start
              as standbys for its epoch: SparkSession warm, the state of their
              key groups loaded and tailed (see the worker's standby.py) while
              the old instances keep processing;
    HANDOVER  the old instances stop after their last commit, the new assignment
              is written, the standbys see the epoch and take their key groups;
    RETIRE    what belonged to the old epoch is deleted; the record moves to history.

With `fluid` (one key group per step) and `batched` (spec.rescale.batchKeyGroups
per step), Megaphone's strategies, no instance stops for the key groups to move:

    PRESTAGE  a scale-out starts the added instances, owning nothing yet;
    HANDOVER  step by step, markers go into the moved key groups' streams (Chi);
              each old owner releases a key group at its marker (a backlogged
              one at its next commit) and its new owner takes it over
              (handover.py); the next step starts when both did.
              Then the new assignment is written in the same generation;
    RETIRE    a scale-in stops the instances left with nothing.

`restart` is Flink's stop-and-restart of the whole job. `resume()` rolls a
rescale back while it is in PRESTAGE (nothing has moved: the instances it
started are removed) and finishes it from HANDOVER on. The controller never
touches processes or pods itself: a `Fleet` does, as processes on this machine
or StatefulSets on Kubernetes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from . import handover
from .control import Phase, RescaleRecord, RescaleState, Strategy
from .jobstore import JobStore
from .keygroups import Assignment, moves
from .plan import JobPlan


class Fleet(Protocol):
    """Where an operator's instances run. Every method is idempotent (a resumed rescale repeats steps)."""

    def start_standbys(self, op: str, parallelism: int, epoch: int) -> None:
        """Start instances 0..parallelism-1 of `op` that wait for assignment `epoch` (worker --await-epoch)."""

    def stop_old(self, op: str, epoch: int) -> None:
        """Stop (after their last commit) the instances of `op` older than `epoch`; return once they are gone."""

    def adopt(self, op: str, parallelism: int, epoch: int) -> None:
        """The standbys of `epoch` are now `op`'s instances; delete what belonged to older epochs."""

    def discard_standbys(self, op: str, epoch: int) -> None:
        """Roll back: remove the standbys of `epoch`."""

    def stop_job(self) -> None:
        """Stop every instance of the job after its last commit (a consistent cut)."""

    def start_job(self, parallelism: dict[str, int]) -> None:
        """Start every operator with this parallelism and wait until it processes."""

    def add_instances(self, op: str, parallelism: int) -> None:
        """Have instances 0..parallelism-1 of `op` running (the added ones own nothing yet); wait until they
        process."""

    def remove_instances(self, op: str, parallelism: int) -> None:
        """Stop the instances of `op` from `parallelism` on (they own nothing any more); return once gone."""

    def start_chain(self, op: str, parallelism: int) -> None:
        """Start the workers of chain `op`, which a plan version being prepared adds; wait until they process."""

    def stop_chain(self, op: str) -> None:
        """Stop every worker of chain `op`, which the plan in force removed; return once they are gone."""


def progress(store: JobStore) -> dict | None:
    """The rescale in progress as `streamjobs status` and the StreamJob's status show it: in PRESTAGE how far
    its standbys are (how many are ready, the most changelog entries one of them applied in its last
    catch-up round); in a fluid or batched HANDOVER how many key groups moved so far."""
    state = store.rescale_state()
    if state is None:
        return None
    shown = state.as_dict()
    if state.phase == Phase.HANDOVER and state.strategy.stepwise:
        return {**shown, "key_groups_moved": len(store.acquired(state.operator))}
    if state.phase != Phase.PRESTAGE:
        return shown
    standbys = store.standbys(state.operator)
    lag = [s.lag for s in standbys if s.lag is not None]
    return {**shown, "standbys_ready": sum(s.epoch == state.epoch for s in standbys),
            "standby_lag": max(lag, default=None)}


class RescaleError(RuntimeError):
    pass


class RescaleController:
    def __init__(
        self, store: JobStore, plan: JobPlan, fleet: Fleet, *, standby_timeout_s: float = 180.0,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
        on_wait: Callable[[RescaleState], None] | None = None,
    ) -> None:
        """`on_wait` sees the saved state at each of the controller's waits: a fault injector raises there to
        kill the controller at a known point (the chaos command)."""
        self.store = store
        self.plan = plan
        self.fleet = fleet
        self.standby_timeout_s = standby_timeout_s
        self.clock = clock
        self.sleep = sleep
        self.on_wait = on_wait

    def current(self) -> RescaleState | None:
        return self.store.rescale_state()

    def history(self) -> list[RescaleRecord]:
        return self.store.rescale_history()

    def parallelism(self) -> dict[str, int]:
        """Per chain head (a chain is deployed and rescaled as one)."""
        return {op: self._assignment_in_force(op).parallelism for op in self.plan.vertices}

    def rescale(self, op: str, parallelism: int, strategy: Strategy | str | None = None,
                owners: tuple[int, ...] | None = None) -> RescaleRecord:
        """Carry a rescale through every phase; return its record (also appended to the history).

        An operator chained into another's workers rescales with its whole chain, named by its head.
        `owners`: the new owner of each key group (a rebalance, rebalance.py), instead of the spec's assignment."""
        try:
            strategy = Strategy.parse(strategy or self.plan.spec.rescale.strategy)
        except ValueError as e:
            raise RescaleError(str(e)) from None
        op = self.plan.head(op)  # KeyError names an unknown operator before anything changes
        if parallelism < 1:
            raise RescaleError(f"parallelism of '{op}' must be >= 1, got {parallelism}")
        if self.current() is not None:
            raise RescaleError(f"a rescale is in progress: {self.current().as_dict()}")
        old = self._assignment_in_force(op)
        if owners is not None and (len(owners) != len(old.owners) or set(owners) != set(range(parallelism))):
            raise RescaleError(f"owners of '{op}' must name every one of its {len(old.owners)} key groups and every "
                               f"instance 0..{parallelism - 1}")
        state = RescaleState(op, old.parallelism, parallelism, strategy, old.epoch + 1, Phase.PRESTAGE, time.time(),
                             owners=owners)
        self.store.save_rescale(state)
        try:
            return self._advance(state, self.clock())
        except Exception:
            if self.current().phase == Phase.PRESTAGE:
                self.resume()  # nothing moved yet: leave the job as it was
            raise

    def resume(self) -> RescaleRecord | None:
        """Finish or roll back a rescale that a previous controller left; None when there was none."""
        state = self.current()
        if state is None:
            return None
        if state.phase == Phase.PRESTAGE:
            if state.strategy == Strategy.ALL_AT_ONCE:
                self.fleet.discard_standbys(state.operator, state.epoch)
            if state.strategy.stepwise:
                self.fleet.remove_instances(state.operator, state.from_parallelism)
            self.store.drop_rescale(state.operator)
            return RescaleRecord.of(state, pause_ms=0.0, rolled_back=True)
        return self._advance(state, self.clock())

    # --- phases ------------------------------------------------------------------

    def _advance(self, state: RescaleState, started: float) -> RescaleRecord:
        state, pause_ms = (self._stepwise if state.strategy.stepwise else self._revoking)(state, started)
        record = RescaleRecord.of(state, pause_ms, round(self.clock() - started, 3))
        self.store.end_rescale(record)
        return record

    def _revoking(self, state: RescaleState, started: float) -> tuple[RescaleState, float]:
        """all_at_once / restart: the old instances stop, then the new assignment takes effect at once."""
        op, n, epoch = state.operator, state.to_parallelism, state.epoch
        paused = None
        if state.phase == Phase.PRESTAGE:
            if state.strategy == Strategy.ALL_AT_ONCE:
                self.store.clear_prestage(op)
                self.store.publish_upcoming(op, self._assignment(op, n, epoch, state.owners))
                self.fleet.start_standbys(op, n, epoch)
                self._wait_standbys(op, n, epoch)
            state = self._save(state.at(Phase.HANDOVER))
        if state.phase == Phase.HANDOVER:
            paused = self.clock()
            if state.strategy == Strategy.RESTART:
                self.fleet.stop_job()
            else:
                self.fleet.stop_old(op, epoch)
            old = self._assignment_in_force(op)
            moved = state.moved_key_groups
            if old.epoch < epoch:  # a resumed HANDOVER may have switched already
                new = self._assignment(op, n, epoch, state.owners)
                self.store.write_assignment(op, new)
                moved = len(moves(old, new))
            state = self._save(state.at(Phase.RETIRE, moved_key_groups=moved))
        if state.phase == Phase.RETIRE:
            if state.strategy == Strategy.RESTART:
                self.fleet.start_job(self.parallelism())
            else:
                self.fleet.adopt(op, n, epoch)
                self.store.clear_prestage(op)
        return state, round((self.clock() - (paused if paused is not None else started)) * 1000, 1)

    def _stepwise(self, state: RescaleState, started: float) -> tuple[RescaleState, float]:
        """fluid / batched: key groups move a step at a time while every instance keeps running."""
        op, n, epoch = state.operator, state.to_parallelism, state.epoch
        if state.phase == Phase.PRESTAGE:
            self.fleet.add_instances(op, max(n, state.from_parallelism))
            state = self._save(state.at(Phase.HANDOVER))
        step_ms = []
        if state.phase == Phase.HANDOVER:
            old, new = self._assignment_in_force(op), self._assignment(op, n, epoch, state.owners)
            if old.epoch < epoch:  # a resumed HANDOVER may have switched already
                size = 1 if state.strategy == Strategy.FLUID else self.plan.spec.rescale.batch_key_groups
                moved = moves(old, new)
                for step in handover.steps(moved, size):
                    if not handover.completed(self.store, op, step):
                        self._after_window_end(op, step)
                    begun = self.clock()
                    if not handover.completed(self.store, op, step):
                        at_commit = handover.start(self.store, self.plan, op, step)
                        if at_commit:  # saved, so the record counts the steps of a controller that died too
                            state = self._save(state.at(Phase.HANDOVER,
                                                        released_at_commit=state.released_at_commit + len(at_commit)))
                        self._wait_step(op, step)
                    step_ms.append(round((self.clock() - begun) * 1000, 1))
                handover.finish(self.store, op, new)
                state = state.at(Phase.HANDOVER, moved_key_groups=len(moved), steps=len(step_ms))
            state = self._save(state.at(Phase.RETIRE))
        if state.phase == Phase.RETIRE:
            self.fleet.remove_instances(op, n)
        # Nothing stops: the longest wait of a moved key group is about its step's duration.
        return state, max(step_ms, default=0.0)

    def _after_window_end(self, op: str, step) -> None:
        """Until the step's key groups committed the firing of their next window (at most two windows)."""
        window = handover.window_steps(self.plan, op)
        if window is None:
            return
        first = handover.committed_window(self.store, self.plan, op, step, window)
        deadline = self.clock() + 2 * window[0] / 1000
        while first is not None and self.clock() < deadline:
            if handover.committed_window(self.store, self.plan, op, step, window) > first:
                return
            self._wait(0.01)

    def _wait_step(self, op: str, step) -> None:
        deadline = self.clock() + self.standby_timeout_s
        while not handover.completed(self.store, op, step):
            if self.clock() > deadline:
                raise RescaleError(f"key groups {[m.key_group for m in step]} of '{op}' not handed over after "
                                   f"{self.standby_timeout_s:.0f} s")
            self._wait(0.02)

    def _assignment_in_force(self, op: str) -> Assignment:
        return self.store.assignment(op) or self.plan.initial_assignment(op)

    def _assignment(self, op: str, parallelism: int, epoch: int, owners: tuple[int, ...] | None = None) -> Assignment:
        if owners is not None:
            return Assignment(epoch, owners)
        key_groups = self.plan.key_groups(op)
        if self.plan.spec.rescale.assignment == "consistent_hashing":
            return Assignment.consistent_hashing(parallelism, key_groups, epoch=epoch)
        return Assignment.ranges(parallelism, key_groups, epoch=epoch)

    def _wait_standbys(self, op: str, count: int, epoch: int) -> None:
        """Until `count` standbys of `epoch` are warm and their prestaged state nearly current."""
        bound = self.plan.spec.rescale.prestage_max_lag
        deadline = self.clock() + self.standby_timeout_s
        while True:
            standbys = self.store.standbys(op)
            ready = [s for s in standbys if s.epoch == epoch]
            behind = [s for s in ready if (s.lag or 0) > bound]
            if len(ready) >= count and not behind:
                return
            if self.clock() > deadline:
                raise RescaleError(f"{count - len(ready)} standby instance(s) of '{op}' not ready and "
                                   f"{len(behind)} more than {bound} changelog entries behind "
                                   f"after {self.standby_timeout_s:.0f} s")
            self._wait(0.1)

    def _wait(self, seconds: float) -> None:
        if self.on_wait is not None:
            self.on_wait(self.store.rescale_state())
        self.sleep(seconds)

    def _save(self, state: RescaleState) -> RescaleState:
        self.store.save_rescale(state)
        return state
