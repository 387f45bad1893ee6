"""The job store's port: what its users read and write, whichever store keeps the records."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from ..control import (
    Attempt,
    ControlEvent,
    ControlRecord,
    InstanceAddress,
    JobFailure,
    PartitionProgress,
    Promotion,
    ReconfigureRecord,
    ReconfigureRequest,
    ReconfigureState,
    RescaleRecord,
    RescaleRequest,
    RescaleState,
    StandbyStatus,
)
from ..keygroups import Assignment
from ..plan import JobPlan
from ..watermarks import Runs


class Commit(Protocol):
    """The batch's commit (the exchange's Transaction) that a store's records go into, to apply with it."""
    def hset(self, key: str, mapping: dict) -> None: ...
    def hdel(self, key: str, *fields: str) -> None: ...
    def delete(self, key: str) -> None: ...
    def apply_in_commit(self, write: Callable[[], None]) -> None:
        """Run `write` inside the commit, after its fence check: a store kept beside the exchange."""


class JobStore(Protocol):
    # --- the deployed job ------------------------------------------------------------
    def deploy(self, plan: JobPlan, owner: str | None = None) -> None:
        """The plan and every chain's first assignment; `owner`, the deploying object (a StreamJob's uid)."""
    def plan(self) -> JobPlan | None: ...
    def restamp(self, t0_ms: int) -> JobPlan:
        """Fix the sources' event-time origin: just before they start, so the job does not begin behind."""
    def deployed_by(self) -> str | None: ...
    def clear(self, keep_input: bool = True) -> int:
        """Forget the job: state, progress, outputs and control records; its input streams too unless
        `keep_input` (external producers may have written them before a run started). Returns keys deleted."""

    # --- assignment and per-key-group ownership ---------------------------------
    def assignment(self, op: str) -> Assignment | None: ...
    def upcoming_assignment(self, op: str) -> Assignment | None:
        """The assignment an all_at_once rescale in PRESTAGE will switch to (its standbys prestage it)."""
    def write_assignment(self, op: str, assignment: Assignment, generation: int | None = None) -> None:
        """The assignment in force. Commits are fenced by its generation (default: the epoch): a rescale that
        takes key groups from running instances starts one; a stepwise one, whose instances give them up
        themselves, keeps it."""
    def publish_upcoming(self, op: str, assignment: Assignment) -> None: ...
    def ownership(self, op: str) -> tuple[Assignment | None, dict[int, int]]:
        """The assignment in force and the key groups moved since (kg -> owner now), read at once: the final
        switch replaces the one and drops the other together."""
    def release_in(self, commit: Commit, op: str, releases: dict[int, int]) -> None:
        """Key groups (kg -> new owner) an old owner gives up in this commit."""
    def request_release(self, op: str, releases: dict[int, int]) -> None:
        """Ask owners to give these key groups (kg -> new owner) up at their next commit."""
    def release_requests(self, op: str) -> dict[int, int]: ...
    def mark(self, upstreams: Iterable[str], op: str, targets: dict[int, int]) -> None:
        """Handover markers into the streams of these key groups from each upstream, each naming its key
        group's new owner (kg -> target)."""
    def record_acquired(self, op: str, kgs: Iterable[int], instance: int) -> None: ...
    def acquired(self, op: str) -> dict[int, int]: ...
    def finish_handover(self, op: str, new: Assignment) -> None:
        """`new` in force in the current generation; the handover's records gone, at once."""
    def new_incarnation(self, op: str, instance: int) -> int:
        """A number greater than any earlier one of this instance: a replaced incarnation can no longer commit."""

    # --- what the handover paces itself on ----------------------------------------
    def key_group_lag(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[tuple[str, int], int]:
        """Records produced into and not yet consumed from these key groups' streams, per (upstream, kg)."""
    def committed_watermark(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> int | None:
        """The smallest committed watermark of these key groups' streams; None if one never committed."""
    def consumed(self, upstreams: Iterable[str], op: str, kgs: Iterable[int]) -> dict[int, int]:
        """Records consumed so far from these key groups' streams, summed over the upstreams."""

    # --- the rescale in progress and its history -------------------------------------
    def rescale_state(self) -> RescaleState | None: ...
    def save_rescale(self, state: RescaleState) -> None: ...
    def end_rescale(self, record: RescaleRecord) -> None:
        """Append to the history and clear the rescale in progress, at once."""
    def drop_rescale(self, op: str) -> None:
        """A rolled-back rescale: clear it and what its PRESTAGE published."""
    def clear_prestage(self, op: str) -> None: ...
    def rescale_history(self, start: int = 0) -> list[RescaleRecord]: ...
    def request_rescale(self, request: RescaleRequest) -> None: ...
    def next_rescale_request(self) -> RescaleRequest | None: ...
    def rescale_requests(self) -> list[RescaleRequest]: ...

    # --- live reconfiguration (reconfigure.py) ---------------------------------------------
    def prepare_plan(self, plan: JobPlan, heads: tuple[str, ...]) -> None:
        """`plan`, the next version, readable before it is published, with the first assignment of the chains
        `heads` it adds, their key groups at its version: their workers start on it before anything switches."""
    def withdraw_plan(self, plan: JobPlan, heads: tuple[str, ...]) -> None:
        """A prepared `plan` that will not be published (its chains' workers did not start): it and what was
        written for `heads`."""
    def publish_plan(self, plan: JobPlan, state: ReconfigureState) -> None:
        """`plan` becomes the latest version (the one before kept under its version) and `state` the
        reconfiguration in progress, at once."""
    def plan_version(self, version: int) -> JobPlan | None: ...
    def plans(self) -> list[JobPlan]:
        """Every version of the plan published, oldest first."""
    def record_versions(self, commit: Commit, op: str, kgs: Iterable[int], version: int) -> None:
        """These key groups (source partitions) of `op` switched to `version` in this commit."""
    def versions(self, op: str) -> dict[int, int]:
        """The version each key group of `op` switched to; one never switched is absent (version 0)."""
    def record_cut(self, commit: Commit, op: str, version: int, offsets: dict[int, int | bytes]) -> None:
        """The offsets at which these partitions of source `op` switched to `version`."""
    def cut(self, version: int) -> dict[tuple[str, int], bytes]: ...
    def record_aligned(self, commit: Commit, op: str, instance: int, version: int, ms: float) -> None: ...
    def aligned(self, version: int) -> dict[str, float]: ...
    def record_reset(self, commit: Commit, op: str, version: int, watermarks: dict[int, int]) -> None:
        """Stage `op` dropped its state at its switch to `version`; per key group, the watermark it had then
        (the windows that fired before it)."""
    def resets(self, version: int, op: str) -> dict[int, int]: ...
    def reconfigure_state(self) -> ReconfigureState | None: ...
    def end_reconfigure(self, record: ReconfigureRecord, control: ControlRecord | None = None) -> None:
        """Append to the history (and `control`, a control event's, to its own) and clear the reconfiguration
        in progress, at once."""
    def reconfigure_history(self, start: int = 0) -> list[ReconfigureRecord]: ...
    def request_reconfigure(self, request: ReconfigureRequest) -> None: ...
    def next_reconfigure_request(self) -> ReconfigureRequest | None: ...

    # --- control events (reconfigure.py, controlhandlers.py) -------------------------------
    def record_reply(self, commit: Commit, event: str, op: str, instance: int, reply: str) -> None:
        """An instance's reply (JSON) to control event `event`, with its switch to the event's plan version."""
    def replies(self, event: str) -> dict[str, object]: ...
    def record_decision(self, entry: dict, keep: int) -> None:
        """An autoscaler decision, the last `keep` kept."""
    def decisions(self) -> list[dict]: ...
    def request_control(self, event: ControlEvent) -> None: ...
    def next_control_request(self) -> ControlEvent | None: ...
    def end_control(self, record: ControlRecord) -> None: ...
    def control_history(self, start: int = 0) -> list[ControlRecord]: ...

    # --- standbys and spares ----------------------------------------------------------
    def report_standby(self, op: str, instance: int, epoch: int) -> None: ...
    def report_standby_lag(self, op: str, instance: int, applied: int) -> None: ...
    def standbys(self, op: str) -> list[StandbyStatus]: ...
    def spare_ready(self, op: str, spare: str) -> None: ...
    def ready_spares(self, op: str) -> set[str]: ...
    def spare_gone(self, op: str, spare: str) -> None: ...
    def promote(self, op: str, spare: str, promotion: Promotion) -> None: ...
    def await_promotion(self, op: str, spare: str, timeout_s: float) -> Promotion | None: ...
    def demote(self, op: str, instance: int, spare: str) -> None: ...
    def demoted_as(self, op: str, instance: int) -> str | None: ...
    def promote_pod(self, op: str, ordinal: int, epoch: int) -> None: ...
    def demote_pods(self, op: str, ordinals: list[int]) -> None: ...
    def promoted_pod(self, op: str, ordinal: int) -> int | None: ...

    # --- instances and the job ------------------------------------------------------------
    def register(self, address: InstanceAddress) -> None: ...
    def unregister(self, op: str, instance: int) -> None: ...
    def registered(self) -> dict[tuple[str, int], str]: ...
    def request_stop(self) -> None: ...
    def stop_requested(self) -> bool: ...
    def request_suspend(self) -> None:
        """Stop at the last commits without draining (`streamjobs stop`): the job goes on later from there."""
    def suspend_requested(self) -> bool: ...
    def request_pause(self, at_ms: int, until_ms: int) -> None:
        """The sources read what is due by `at_ms` (a generator's offsets then meet at one global index) and no
        more, while every other operator goes on: the job drains what is in flight (`savepoint --drain-in-flight`).
        The pause lapses at `until_ms`: a caller that dies does not leave the job paused."""
    def paused_at(self, now_ms: int) -> int | None:
        """The instant of a pause in force at `now_ms`."""
    def resumed(self) -> None:
        """A suspended, paused or failed job runs again."""
    def forget_processes(self, ops: Iterable[str]) -> None:
        """What the processes of an earlier run said of themselves (endpoints, warm spares): a run that goes on
        after they died starts new ones."""
    def attempt(self, op: str, instance: int) -> Attempt | None: ...
    def save_attempt(self, op: str, instance: int, attempt: Attempt | None) -> None:
        """None: the instance stopped cleanly; its next start counts from one."""
    def fail(self, failure: JobFailure) -> None:
        """The job cannot go on (the first failure said stays)."""
    def failure(self) -> JobFailure | None: ...

    # --- committed input progress ----------------------------------------------------------
    def record_partitions(self, commit: Commit, op: str, progress: dict[int, PartitionProgress],
                          watermarks: dict[int, int] | None = None) -> None: ...
    def partitions(self, op: str, partitions: Iterable[int]) -> dict[int, tuple[PartitionProgress | None, int | None]]:
        """Per source partition: what it committed (None: nothing yet) and its watermark."""
    def record_streams(self, commit: Commit, op: str, progress: dict[str, tuple[bytes, Runs]]) -> None:
        """Per input stream: the last entry consumed and its upstream instances' watermarks."""
    def streams(self, op: str, names: list[str]) -> list[tuple[bytes | None, Runs | None]]: ...
    def forget_streams(self, commit: Commit, op: str, names: list[str]) -> None:
        """Input streams `op` reads no more (their producer's tail changed live): them and their progress."""
    def drop_inputs(self, plan: JobPlan, op: str) -> None:
        """Chain head `op` of `plan`, which a later version removed, reads nothing more: its input streams and
        its progress in them go."""

    # --- state, as its readers outside the workers see it (the oracle, a savepoint's re-split) ---------------
    def state_logs(self, op: str, key_groups: int) -> list[tuple[bytes | None, list[tuple[bytes, dict]]]]:
        """Per key group of `op`: its snapshot (None without one) and every entry of its changelog."""


class ChangeInProgress(RuntimeError):
    """A rescale or a reconfiguration is in progress: the message says which."""
