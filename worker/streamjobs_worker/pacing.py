"""When a worker runs the batch it has read: event-driven, paced only where running now saves nothing.

An idle instance blocks on its kg streams and wakes when an entry arrives. What
it read then runs at once when that lowers latency, and waits (reading on, so
the next batch is larger and Spark's fixed cost is shared) when it would not:

- a source polls once per tick (50 ms) while it keeps up, at once while it is
  behind; a chain that runs Spark after its source also spends at most half of
  its time on per-batch fixed cost (below);
- a backlog (a read that came back full), a handover to commit, undecodable
  entries to dead-letter and the end of the input run at once;
- a window stage runs when its watermark passes a window's end (plus allowed
  lateness) in any owned key group: records of windows not yet due produce
  nothing sooner for being aggregated sooner. They wait at most minIntervalMs;
- any other chain (stateless or stateful stages, sinks) runs when records
  arrive or its watermark moved, but starts no sooner after the last batch than
  that batch took (capped by minIntervalMs): at light load at most half of its
  time goes to per-batch fixed cost, and a cheap batch (a Redis sink's) is not
  held back at all.
"""

from __future__ import annotations

from streamjobs_core.generators import MAX_WATERMARK
from streamjobs_core.spec import BatchingSettings

from .inputs import MIN_WATERMARK, InputBatch

SOURCE_TICK_S = 0.05


class Pacing:
    def __init__(self, batching: BatchingSettings, head_spec, is_source: bool, runs_spark: bool = False) -> None:
        self._is_source = is_source
        self._runs_spark = runs_spark
        self._max_wait_s = batching.max_wait_ms / 1000
        self._min_interval_s = batching.min_interval_ms / 1000
        window = getattr(head_spec, "window", None)
        self._step = window.step_ms if window is not None else None
        self._lateness = getattr(head_spec, "allowed_lateness_ms", 0)
        self._ran_watermarks: dict[int, int] = {}  # per key group, the watermark the last batch ran with
        self._ran_watermark = MIN_WATERMARK
        self._last_end = float("-inf")
        self._last_busy_s = 0.0
        self._first_pending_at: float | None = None

    def due(self, batch: InputBatch, releasing: bool, now: float) -> bool:
        if self._is_source or batch.full or releasing or batch.bad or batch.watermark == MAX_WATERMARK:
            return True
        if batch.records and self._first_pending_at is None:
            self._first_pending_at = now
        if self._step is not None:
            return (
                self._window_due(batch.watermarks)
                or (batch.records > 0 and now - self._first_pending_at >= self._min_interval_s)
                or (batch.watermark > self._ran_watermark and now - self._last_end >= self._min_interval_s)
            )
        if not batch.records and batch.watermark <= self._ran_watermark:
            return False  # nothing new to process or to tell downstream
        return now - self._last_end >= self._pace_s

    def wait_ms(self, pending: InputBatch | None, now: float) -> int:
        """How long the next read may block: until the pending batch would be due by time, at most maxWaitMs."""
        wait = self._max_wait_s
        if pending is not None and pending.records:
            if self._step is not None:
                wait = min(wait, self._first_pending_at + self._min_interval_s - now)
            else:
                wait = min(wait, self._last_end + self._pace_s - now)
        return max(1, round(wait * 1000))

    def source_wait_ms(self, behind: bool, now: float) -> int:
        """How long a source waits before its next poll (a generator sleeps, an external source blocks on its
        streams and wakes when an entry arrives): not at all while behind, else until its next tick."""
        if behind:
            return 0
        since = now - self._last_end
        wait = SOURCE_TICK_S - self._last_busy_s - since
        if self._runs_spark:
            wait = max(wait, self._pace_s - since)
        return round(max(0.0, wait) * 1000)

    def ran(self, batch: InputBatch, busy_s: float, now: float) -> None:
        self._ran_watermarks = dict(batch.watermarks)
        self._ran_watermark = batch.watermark
        self._last_end = now
        self._last_busy_s = busy_s
        self._first_pending_at = None

    @property
    def _pace_s(self) -> float:
        return min(self._min_interval_s, self._last_busy_s)

    def _window_due(self, watermarks: dict[int, int]) -> bool:
        """Whether a key group's watermark passed a window end (+ lateness) since the last batch ran."""
        step, lateness = self._step, self._lateness
        for kg, mark in watermarks.items():
            before = self._ran_watermarks.get(kg, MIN_WATERMARK)
            if mark > before and (mark - lateness) // step > (before - lateness) // step:
                return True
        return False
