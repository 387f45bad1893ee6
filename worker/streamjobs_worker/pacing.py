"""When a worker runs the batch it has read: event-driven, paced only where running now saves nothing.

An idle instance blocks on its kg streams and wakes when an entry arrives. What
it read then runs at once when that lowers latency, and waits (reading on, so
the next batch is larger and Spark's fixed cost is shared) when it would not:

- a source polls once per tick (50 ms) while it keeps up, at once while it is
  behind; a chain that runs Spark after its source also spends at most half of
  its time on per-batch fixed cost (below);
- a backlog (a read that came back full), a handover to commit, undecodable
  entries to dead-letter and the end of the input run at once; so does a batch
  whose input edge holds more than maxLagRecords unconsumed (the worker asks):
  its producers are paused until it commits, and nothing more is coming;
- a window stage runs when its watermark passes a window's end (plus allowed
  lateness) in any owned key group: records of windows not yet due produce
  nothing sooner for being aggregated sooner. After minIntervalMs they run
  anyway (so that long windows do not hold a backlog), unless the next window
  end is close: a batch started then would hold up the one that fires it (if
  that end does not come within two batch durations more, they run too);
- any other chain (stateless or stateful stages, sinks) runs when records
  arrive or its watermark moved, but starts no sooner after the last batch than
  that batch took (capped by minIntervalMs): at light load at most half of its
  time goes to per-batch fixed cost, and a cheap batch (a Redis sink's) is not
  held back at all.
"""

from __future__ import annotations

from streamjobs_core.spec import BatchingSettings
from streamjobs_core.watermarks import MAX_WATERMARK, MIN_WATERMARK

from .inputs import InputBatch

SOURCE_TICK_S = 0.05


class Pacing:
    def __init__(self, batching: BatchingSettings, head_spec, runs_spark: bool = False) -> None:
        self._runs_spark = runs_spark
        self._max_wait_s = batching.max_wait_ms / 1000
        self._min_interval_s = batching.min_interval_ms / 1000
        window = getattr(head_spec, "window", None)
        self._step = window.step_ms if window is not None else None
        self._lateness = getattr(head_spec, "allowed_lateness_ms", 0)
        self._ran_watermarks: dict[int, int] = {}  # per key group, the watermark the last batch ran with
        self._ran_watermark = MIN_WATERMARK
        self._last_end = float("-inf")  # of any batch: watermark-only ones included
        # The last batch with records (a Spark job where the chain runs one): its end and duration.
        self._work_end = float("-inf")
        self._work_s = 0.0
        self._last_s = 0.0
        self._first_pending_at: float | None = None

    def due(self, batch: InputBatch, releasing: bool, now: float) -> bool:
        """Whether the batch read from kg streams runs now (a source's runs at every poll: source_wait_ms)."""
        if batch.full or releasing or batch.bad or batch.watermark == MAX_WATERMARK:
            return True
        if batch.records and self._first_pending_at is None:
            self._first_pending_at = now
        if self._step is not None:
            if self._window_due(batch.watermarks):
                return True
            if batch.records:
                waited = now - self._first_pending_at
                if waited >= self._min_interval_s + 2 * self._work_s:
                    return True  # the window end did not come (the input went idle): run them all the same
                return waited >= self._min_interval_s and self._to_next_end_ms(batch.watermark) > 2000 * self._work_s
            # Nothing to aggregate: the watermark alone goes downstream (no Spark job), at least this often.
            return batch.watermark > self._ran_watermark and now - self._last_end >= self._min_interval_s
        if not batch.records:
            return batch.watermark > self._ran_watermark  # tell downstream: no Spark job, no fixed cost
        return now - self._work_end >= self._pace_s

    def wait_ms(self, pending: InputBatch | None, now: float) -> int:
        """How long the next read may block: until the pending batch would be due by time, at most maxWaitMs."""
        wait = self._max_wait_s
        if pending is not None and pending.records:
            if self._step is not None:
                wait = min(wait, self._first_pending_at + self._min_interval_s - now)
            else:
                wait = min(wait, self._work_end + self._pace_s - now)
        return max(1, round(wait * 1000))

    def source_wait_ms(self, behind: bool, now: float) -> int:
        """How long a source waits before its next poll (a generator sleeps, an external source blocks on its
        streams and wakes when an entry arrives): not at all while behind, else until its next tick."""
        if behind:
            return 0
        since = now - self._last_end
        wait = SOURCE_TICK_S - self._last_s - since
        if self._runs_spark:
            wait = max(wait, self._pace_s - (now - self._work_end))
        return round(max(0.0, wait) * 1000)

    def ran(self, batch: InputBatch, busy_s: float, now: float) -> None:
        self._ran_watermarks = dict(batch.watermarks)
        self._ran_watermark = batch.watermark
        self._last_end = now
        self._last_s = busy_s
        if batch.records:
            self._work_end = now
            self._work_s = busy_s
            self._first_pending_at = None

    @property
    def _pace_s(self) -> float:
        return min(self._min_interval_s, self._work_s)

    def _to_next_end_ms(self, watermark: int) -> int:
        """Event time until the watermark passes the next window end (plus lateness): about as much wall time."""
        return self._step - (watermark - self._lateness) % self._step

    def _window_due(self, watermarks: dict[int, int]) -> bool:
        """Whether a key group's watermark passed a window end (+ lateness) since the last batch ran."""
        step, lateness = self._step, self._lateness
        for kg, mark in watermarks.items():
            before = self._ran_watermarks.get(kg, MIN_WATERMARK)
            if mark > before and (mark - lateness) // step > (before - lateness) // step:
                return True
        return False
