"""A source as a worker's input: poll it, shed load past its bound, collect its undecodable records.

Between polls a generator source sleeps (pacing.py says how long: a tick while
it keeps up), an external stream's source blocks on its input streams for as
long, so a record that arrives wakes it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pyarrow as pa
import redis
from streamjobs_core import shedding
from streamjobs_core.exchange import Transaction
from streamjobs_core.jobstore import JobStore
from streamjobs_core.plan import JobPlan
from streamjobs_core.spec import BatchingSettings

from .inputs import InputBatch
from .metrics import WorkerMetrics
from .sources import RedisInputSource, make_source

if TYPE_CHECKING:
    from .pacing import Pacing

_CONTROL_EVERY_S = 0.2


class SourceInput:
    def __init__(self, r: redis.Redis | None, store: JobStore, plan: JobPlan, op: str, owned: tuple[int, ...],
                 metrics: WorkerMetrics) -> None:
        self._jobs = store
        self._plan = plan
        self._op = op
        self._spec = plan.spec.operator(op)
        self._metrics = metrics
        self.source = make_source(r, store, plan, op, owned)
        self._stop_requested = False
        self._paused_at: int | None = None  # ms: read what is due by then and no more (a drain in progress)
        self._last_control = 0.0
        self.version = plan.version  # the plan this instance runs
        self._asked_version = plan.version  # the version a reconfiguration in progress asks for
        self.aligning_since: float | None = None  # a source has no barriers to wait for
        self.holding = False
        self._shed_log: list[tuple[dict, int]] = []  # shed log entries and counts of the batch, not committed yet
        batching = plan.spec.batching  # the first batches: 1,000 records, within [minRecords, maxRecords]
        self._budget = min(batching.max_records, max(batching.min_records, 1000))

    def restore(self) -> None:
        self.source.restore()

    def wait_ms(self, pacing: Pacing, pending: InputBatch | None, now: float) -> int:
        return pacing.source_wait_ms(self.behind, now)

    def due(self, pacing: Pacing, batch: InputBatch, releasing: bool, now: float) -> bool:
        return True  # paced before the poll instead (wait_ms): what a poll returns was due

    def adapt(self, batch: InputBatch, busy_s: float, batching: BatchingSettings) -> None:
        target = batching.target_batch_ms / 1000
        if self.behind and busy_s < target:
            self._budget = min(batching.max_records, self._budget * 2)
        elif busy_s > 2 * target:
            self._budget = max(batching.min_records, self._budget // 2)

    def read(self, block_ms: int) -> InputBatch:
        budget = self._budget
        started = time.time()
        if started - self._last_control >= _CONTROL_EVERY_S:
            self._stop_requested = self._jobs.stop_requested()
            self._paused_at = self._jobs.paused_at(int(started * 1000))
            reconfiguring = self._jobs.reconfigure_state()
            if reconfiguring is not None:
                self._asked_version = reconfiguring.version
            self._last_control = started
        if isinstance(self.source, RedisInputSource) and self._paused_at is not None and not self._stop_requested:
            time.sleep(block_ms / 1000)  # its offsets stay where the pause found them
            table, watermark, waited = None, self.source.watermark(), block_ms / 1000
        elif isinstance(self.source, RedisInputSource):
            table, watermark = self.source.poll(budget, started, self._stop_requested, block_ms)
            waited = time.time() - started if table is None else 0.0
        else:
            time.sleep(block_ms / 1000)
            waited = block_ms / 1000
            # Paused, a generator reads on to what was due at the pause: every partition meets one global index.
            now = time.time() if self._paused_at is None else min(time.time(), self._paused_at / 1000)
            table, watermark = self.source.poll(budget, now, self._stop_requested)
        return self._batch(table, watermark, waited)

    def _batch(self, table: pa.Table | None, watermark: int, waited: float) -> InputBatch:
        self._metrics.source_pending.set(self.source.pending)
        batch = InputBatch(watermark=watermark)
        polled = table.num_rows if table is not None else 0
        batch.records = polled
        load_shedding = getattr(self._spec, "load_shedding", None)
        if polled and load_shedding is not None and self.source.pending > load_shedding.max_backlog_records:
            table = self._shed(table, load_shedding)
        if table is not None and table.num_rows:
            batch.tables[self._op] = [table]
        batch.bad = list(self.source.bad)
        self.source.bad.clear()
        batch.watermarks = self.key_group_watermarks()
        batch.waited_s = waited
        return batch

    @property
    def isolates(self) -> bool:
        return isinstance(self.source, RedisInputSource)

    def positions(self) -> dict[str, bytes]:
        return self.source.positions()

    def read_one(self, stream: str) -> InputBatch:
        started = time.time()
        table, watermark = self.source.poll(1, started, self._stop_requested, only=self.source.partition_of(stream))
        return self._batch(table, watermark, 0.0)

    def skip(self, stream: str, entry_id: bytes) -> dict:
        return self.source.skip(stream, entry_id)

    @property
    def behind(self) -> bool:
        """The last poll left records that were due (or waiting in Redis) for the next one."""
        return self.source.behind

    def _shed(self, table: pa.Table, load_shedding) -> pa.Table | None:
        """Drop part of the batch; logged with the offsets it commits with, so it is never silent and an
        oracle repeats the choice."""
        mask = shedding.shed_mask(table, load_shedding, self.source.ranges)
        shed = int(mask.sum())
        if shed:
            entry = shedding.log_entry(self._op, shed, table.num_rows - shed, self.source.ranges,
                                       self.source.shed_ids(mask))
            self._shed_log.append((entry, shed))
        return table.filter(pa.array(~mask)) if shed < table.num_rows else None

    def add_progress(self, txn: Transaction) -> None:
        keys = self._plan.keys
        for entry, shed in self._shed_log:
            txn.xadd(keys.shed, entry, 100_000)
            txn.hincrby(keys.shed_totals, self._op, shed)
            txn.after_commit.append(lambda shed=shed: self._metrics.shed_records.inc(shed))
        self._shed_log.clear()
        self.source.add_progress(txn)

    def aligned(self) -> int | None:
        """The plan version to switch to with this batch's commit, when a reconfiguration asks for one: the
        commit's offsets are the cut (reconfigure.py)."""
        return self._asked_version if self._asked_version > self.version else None

    def switch(self, plan: JobPlan, txn: Transaction) -> None:
        self.version = plan.version

    def offsets(self) -> dict[int, int | bytes]:
        """Per owned partition, where the next commit leaves it: a reconfiguration's cut, when it switches."""
        return self.source.offsets()

    def records_read(self) -> dict[int, int]:
        return {}  # a source reads no upstream operator

    def lag(self) -> dict[tuple[str, int], int]:
        return {}

    def acquire(self, kgs) -> None:
        self.source.acquire(kgs)

    def release(self, kg: int) -> None:
        self.source.release(kg)

    def handovers(self) -> dict[int, int]:
        return {}  # a source partition has no stream to mark: it moves only when asked (release requests)

    @property
    def watermark(self) -> int:
        return self.source.watermark()

    def key_group_watermarks(self) -> dict[int, int]:
        mark = self.source.watermark()
        return {p: mark for p in self.source.partitions}

    @property
    def finished(self) -> bool:
        return self.source.finished
