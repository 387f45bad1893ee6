"""The worker's side of the per-key-group handover (the controller's side is streamjobs_core.handover).

Which key groups this instance owns, which it gives up with a batch's commit
(at their markers, or asked to by the controller), and which were released to
it since: all read and written through the job store, so a fluid or batched
rescale's protocol is these two modules and the store's records.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from streamjobs_core import handover
from streamjobs_core.jobstore import Commit, JobStore
from streamjobs_core.plan import JobPlan

_POLL_S = 0.1


class Ownership:
    def __init__(self, store: JobStore, plan: JobPlan, op: str, instance: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._op = op
        self._instance = instance
        self._clock = clock
        self.owned: tuple[int, ...] = handover.owned_by(store, plan, op, instance)
        self._asked: dict[int, int] = {}  # key group -> new owner, as the controller asked at the last poll
        self._last_poll = float("-inf")

    def resumed(self) -> None:
        """After a restart: say again which key groups this instance took over (or was about to say so); the
        controller waits to hear it. Only those it owned as it started: one released to it since (while Spark
        started) is an arrival, whose state and offsets are not loaded yet. Said taken now, the controller would
        finish the handover, and with the moved key groups gone this instance would never take it over."""
        self._store.record_acquired(
            self._op, [kg for kg in handover.moved_to(self._store, self._op, self._instance) if kg in self.owned],
            self._instance)

    def releases(self, at_markers: dict[int, int]) -> dict[int, int]:
        """Key groups to give up with the next commit (kg -> new owner): those whose markers the batch reached
        and those the controller asked for."""
        asked = {kg: to for kg, to in self._asked.items() if kg in self.owned and to != self._instance}
        return {**at_markers, **asked}

    def release_in(self, commit: Commit, releases: dict[int, int]) -> None:
        """The releases go into the batch's commit: the new owner takes the key group from exactly there."""
        self._store.release_in(commit, self._op, releases)

    def released(self, releases: dict[int, int]) -> None:
        self.owned = tuple(kg for kg in self.owned if kg not in releases)

    def arrivals(self) -> list[int]:
        """Key groups released to this instance and not taken over yet; looked at every 0.1 s at most."""
        now = self._clock()
        if now - self._last_poll < _POLL_S:
            return []
        self._last_poll = now
        self._asked = self._store.release_requests(self._op)
        return [kg for kg in handover.moved_to(self._store, self._op, self._instance) if kg not in self.owned]

    def taken_over(self, kgs: list[int]) -> None:
        """Once their state and offsets are restored here: the controller paces its steps on it."""
        self.owned = tuple(sorted({*self.owned, *kgs}))
        self._store.record_acquired(self._op, kgs, self._instance)
