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

import json
import time
from collections.abc import Callable
from typing import Protocol

from . import handover
from .keygroups import Assignment, moves
from .layout import JobKeys
from .plan import JobPlan, read_assignment, write_assignment

STRATEGIES = ("all_at_once", "fluid", "batched", "restart")
STEPWISE = ("fluid", "batched")
PRESTAGE, HANDOVER, RETIRE = "PRESTAGE", "HANDOVER", "RETIRE"


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


def progress(r, keys: JobKeys) -> dict | None:
    """The rescale in progress: in PRESTAGE how far its standbys are (how many are ready, the most
    changelog entries one of them applied in its last catch-up round); in a fluid or batched HANDOVER
    how many key groups moved so far."""
    raw = r.get(keys.rescale_current)
    if raw is None:
        return None
    state = json.loads(raw)
    if state["phase"] == HANDOVER and state["strategy"] in STEPWISE:
        return {**state, "key_groups_moved": r.hlen(keys.acquired(state["operator"]))}
    if state["phase"] != PRESTAGE:
        return state
    op, epoch = state["operator"], state["epoch"]
    ready = sum(int(e) == epoch for e in r.hvals(keys.standby(op)))
    lag = [int(n) for n in r.hvals(keys.standby_lag(op))]
    return {**state, "standbys_ready": ready, "standby_lag": max(lag, default=None)}


class RescaleError(RuntimeError):
    pass


class RescaleController:
    def __init__(
        self, r, plan: JobPlan, fleet: Fleet, *, standby_timeout_s: float = 180.0,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.r = r
        self.plan = plan
        self.keys = plan.keys
        self.fleet = fleet
        self.standby_timeout_s = standby_timeout_s
        self.clock = clock
        self.sleep = sleep

    def current(self) -> dict | None:
        raw = self.r.get(self.keys.rescale_current)
        return json.loads(raw) if raw else None

    def history(self) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(self.keys.rescale_history, 0, -1)]

    def parallelism(self) -> dict[str, int]:
        """Per chain head (a chain is deployed and rescaled as one)."""
        return {op: read_assignment(self.r, self.keys, op).parallelism for op in self.plan.vertices}

    def rescale(self, op: str, parallelism: int, strategy: str | None = None) -> dict:
        """Carry a rescale through every phase; return its record (also appended to the history).

        An operator chained into another's workers rescales with its whole chain, named by its head."""
        strategy = strategy or self.plan.spec.rescale.strategy
        if strategy not in STRATEGIES:
            raise RescaleError(f"unknown rescale strategy '{strategy}' (one of {', '.join(STRATEGIES)})")
        op = self.plan.head(op)  # KeyError names an unknown operator before anything changes
        if parallelism < 1:
            raise RescaleError(f"parallelism of '{op}' must be >= 1, got {parallelism}")
        if self.current() is not None:
            raise RescaleError(f"a rescale is in progress: {self.current()}")
        old = read_assignment(self.r, self.keys, op)
        state = {
            "operator": op, "from": old.parallelism, "to": parallelism, "strategy": strategy,
            "epoch": old.epoch + 1, "phase": PRESTAGE, "started_at": time.time(),
        }
        self._save(state)
        try:
            return self._advance(state, self.clock())
        except Exception:
            if self.current()["phase"] == PRESTAGE:
                self.resume()  # nothing moved yet: leave the job as it was
            raise

    def resume(self) -> dict | None:
        """Finish or roll back a rescale that a previous controller left; None when there was none."""
        state = self.current()
        if state is None:
            return None
        if state["phase"] == PRESTAGE:
            if state["strategy"] == "all_at_once":
                self.fleet.discard_standbys(state["operator"], state["epoch"])
            if state["strategy"] in STEPWISE:
                self.fleet.remove_instances(state["operator"], state["from"])
            self.r.delete(*self._prestage_keys(state["operator"]), self.keys.rescale_current)
            return {**state, "phase": "ROLLED_BACK"}
        return self._advance(state, self.clock())

    # --- phases ------------------------------------------------------------------

    def _advance(self, state: dict, started: float) -> dict:
        record = (self._stepwise if state["strategy"] in STEPWISE else self._revoking)(state, started)
        record["rescale_s"] = round(self.clock() - started, 3)
        pipe = self.r.pipeline()
        pipe.rpush(self.keys.rescale_history, json.dumps(record))
        pipe.delete(self.keys.rescale_current)
        pipe.execute()
        return record

    def _revoking(self, state: dict, started: float) -> dict:
        """all_at_once / restart: the old instances stop, then the new assignment takes effect at once."""
        op, n, epoch = state["operator"], state["to"], state["epoch"]
        paused = None
        if state["phase"] == PRESTAGE:
            if state["strategy"] == "all_at_once":
                self.r.delete(*self._prestage_keys(op))
                write_assignment(self.r, self.keys, op, self._assignment(op, n, epoch), upcoming=True)
                self.fleet.start_standbys(op, n, epoch)
                self._wait_standbys(op, n, epoch)
            state = self._save({**state, "phase": HANDOVER})
        if state["phase"] == HANDOVER:
            paused = self.clock()
            if state["strategy"] == "restart":
                self.fleet.stop_job()
            else:
                self.fleet.stop_old(op, epoch)
            old = read_assignment(self.r, self.keys, op)
            if old.epoch < epoch:  # a resumed HANDOVER may have switched already
                new = self._assignment(op, n, epoch)
                write_assignment(self.r, self.keys, op, new)
                state = {**state, "moved_key_groups": len(moves(old, new))}
            state = self._save({**state, "phase": RETIRE})
        if state["phase"] == RETIRE:
            if state["strategy"] == "restart":
                self.fleet.start_job(self.parallelism())
            else:
                self.fleet.adopt(op, n, epoch)
                self.r.delete(*self._prestage_keys(op))
        done = self.clock()
        record = {k: v for k, v in state.items() if k not in ("phase", "started_at")}
        record["pause_ms"] = round((done - (paused if paused is not None else started)) * 1000, 1)
        return record

    def _stepwise(self, state: dict, started: float) -> dict:
        """fluid / batched: key groups move a step at a time while every instance keeps running."""
        op, n, epoch = state["operator"], state["to"], state["epoch"]
        if state["phase"] == PRESTAGE:
            self.fleet.add_instances(op, max(n, state["from"]))
            state = self._save({**state, "phase": HANDOVER})
        step_ms = []
        if state["phase"] == HANDOVER:
            old, new = read_assignment(self.r, self.keys, op), self._assignment(op, n, epoch)
            if old.epoch < epoch:  # a resumed HANDOVER may have switched already
                size = 1 if state["strategy"] == "fluid" else self.plan.spec.rescale.batch_key_groups
                moved = moves(old, new)
                for step in handover.steps(moved, size):
                    if not handover.completed(self.r, self.plan, op, step):
                        self._after_window_end(op, step)
                    begun = self.clock()
                    if not handover.completed(self.r, self.plan, op, step):
                        at_commit = handover.start(self.r, self.plan, op, step)
                        if at_commit:  # saved, so the record counts the steps of a controller that died too
                            state = self._save({**state, "released_at_commit":
                                                state.get("released_at_commit", 0) + len(at_commit)})
                        self._wait_step(op, step)
                    step_ms.append(round((self.clock() - begun) * 1000, 1))
                handover.finish(self.r, self.plan, op, new)
                state = {**state, "moved_key_groups": len(moved), "steps": len(step_ms)}
            state = self._save({**state, "phase": RETIRE})
        if state["phase"] == RETIRE:
            self.fleet.remove_instances(op, n)
        record = {k: v for k, v in state.items() if k not in ("phase", "started_at")}
        # Nothing stops: the longest wait of a moved key group is about its step's duration.
        record["pause_ms"] = max(step_ms, default=0.0)
        return record

    def _after_window_end(self, op: str, step) -> None:
        """Until the step's key groups committed the firing of their next window (at most two windows)."""
        window = handover.window_steps(self.plan, op)
        if window is None:
            return
        first = handover.committed_window(self.r, self.plan, op, step, window)
        deadline = self.clock() + 2 * window[0] / 1000
        while first is not None and self.clock() < deadline:
            if handover.committed_window(self.r, self.plan, op, step, window) > first:
                return
            self.sleep(0.01)

    def _wait_step(self, op: str, step) -> None:
        deadline = self.clock() + self.standby_timeout_s
        while not handover.completed(self.r, self.plan, op, step):
            if self.clock() > deadline:
                raise RescaleError(f"key groups {[m.key_group for m in step]} of '{op}' not handed over after "
                                   f"{self.standby_timeout_s:.0f} s")
            self.sleep(0.02)

    def _assignment(self, op: str, parallelism: int, epoch: int) -> Assignment:
        key_groups = self.plan.key_groups(op)
        if self.plan.spec.rescale.assignment == "consistent_hashing":
            return Assignment.consistent_hashing(parallelism, key_groups, epoch=epoch)
        return Assignment.ranges(parallelism, key_groups, epoch=epoch)

    def _wait_standbys(self, op: str, count: int, epoch: int) -> None:
        """Until `count` standbys of `epoch` are warm and their prestaged state nearly current."""
        bound = self.plan.spec.rescale.prestage_max_lag
        deadline = self.clock() + self.standby_timeout_s
        while True:
            ready = {i for i, e in self.r.hgetall(self.keys.standby(op)).items() if int(e) == epoch}
            lag = {i: int(n) for i, n in self.r.hgetall(self.keys.standby_lag(op)).items()}
            behind = {i for i in ready if lag.get(i, 0) > bound}
            if len(ready) >= count and not behind:
                return
            if self.clock() > deadline:
                raise RescaleError(f"{count - len(ready)} standby instance(s) of '{op}' not ready and "
                                   f"{len(behind)} more than {bound} changelog entries behind "
                                   f"after {self.standby_timeout_s:.0f} s")
            self.sleep(0.1)

    def _prestage_keys(self, op: str) -> tuple[str, ...]:
        return self.keys.standby(op), self.keys.standby_lag(op), self.keys.next_assignment(op)

    def _save(self, state: dict) -> dict:
        self.r.set(self.keys.rescale_current, json.dumps(state))
        return state
