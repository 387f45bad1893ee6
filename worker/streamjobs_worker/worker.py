"""One operator instance: read -> process on Spark -> route -> commit, in a loop.

A worker starts from "you own key groups X at epoch E" (the assignment in
Redis, and any key groups a fluid or batched rescale moved since: handover.py),
restores their state and offsets, and processes micro-batches whose
size adapts to the backlog: under no load a batch is whatever arrived within
maxWaitMs (low latency); under backlog batches grow until one takes about
targetBatchMs, so the ~0.25 s fixed cost of a Spark job is amortised.

During a fluid or batched rescale a worker releases a key group in the commit
of the batch that reached its handover markers (or in its next commit when the
controller asks, as it does for source partitions and backlogged owners), and
takes over the key groups released to it between batches.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import msgpack
import pyarrow as pa
import redis
from streamjobs_core import handover, shedding
from streamjobs_core.generators import MAX_WATERMARK
from streamjobs_core.keygroups import runs
from streamjobs_core.plan import JobPlan, edge_totals, read_assignment

from . import poison, recovery
from .inputs import InputBatch, InputReader
from .metrics import WorkerMetrics
from .outputs import OutputRouter
from .rehearsal import rehearse
from .sinks import make_sink
from .sources import make_source
from .stages import make_stage
from .standby import STATEFUL_OPERATOR_TYPES, Prestaged, state_directory
from .state import open_store
from .transaction import Checkpoint, Transaction

log = logging.getLogger(__name__)

_LAG_EVERY_S = 1.0
_LATENCY_SAMPLES = 200
_MAX_ENTRIES_PER_STREAM = 4096
_SOURCE_TICK_S = 0.05
_HANDOVER_POLL_S = 0.1


class Worker:
    def __init__(
        self, r: redis.Redis, plan: JobPlan, op: str, instance: int, metrics_host: str = "127.0.0.1",
        metrics_port: int = 0, advertise_host: str | None = None, prestaged: Prestaged | None = None,
    ) -> None:
        self.r = r
        self.plan = plan
        self.op = op
        self.instance = instance
        self.spec = plan.spec.operator(op)
        keys = plan.keys
        assignment = read_assignment(r, keys, op) or plan.initial_assignment(op)
        self.owned = handover.owned_by(r, plan, op, instance)
        self.incarnation = int(r.incr(keys.incarnation(op, instance)))
        self.checkpoint = Checkpoint(r, keys, op, instance, self.incarnation)
        self.metrics = WorkerMetrics(plan.name, op, instance)
        self.metrics.owned_key_groups.set(len(self.owned))
        self.metrics.assignment_epoch.set(assignment.epoch)
        self.is_source = self.spec in plan.spec.sources
        self.is_sink = self.spec in plan.spec.sinks
        if prestaged is not None and set(prestaged.store.key_groups) != set(self.owned):
            prestaged = None  # prestaged for an assignment that is not the one in force
        self.prestaged = prestaged
        self.store = prestaged.store if prestaged is not None else open_store(
            plan.spec.state.backend, self.owned, state_directory(plan, op, instance, assignment.epoch))
        self.source = make_source(r, plan, op, self.owned) if self.is_source else None
        self.reader = None if self.is_source else InputReader(r, plan, op, instance, self.owned)
        self.stage = None
        if not (self.is_source or self.is_sink):
            self.stage = make_stage(self.spec, self.store, plan.spec.max_parallelism)
        self.sink = make_sink(plan, op, instance) if self.is_sink else None
        self.router = OutputRouter(plan, op, runs(self.owned)) if plan.edges_out(op) else None
        if self.stage is not None and prestaged is None:  # a standby rehearsed while it waited
            rehearse(r, plan, op)
        # Registering the endpoint tells the runtime this instance is ready (Spark is up).
        port = self.metrics.serve(host=metrics_host, port=metrics_port)
        # In a pod the server listens on every interface; others reach it at the pod's IP.
        r.hset(keys.metrics_endpoints, f"{op}/{instance}", f"{advertise_host or metrics_host}:{port}")

        batching = plan.spec.batching
        self._entries_per_stream = 1
        self._source_budget = max(batching.min_records, 1000)
        self._changelog_ids: dict[int, bytes] = {}
        self._unsnapshotted: set[int] = set()
        self._snapshot_sizes: dict[int, int] = {}
        self._batches = 0
        self._done = False
        self._last_lag = 0.0
        self._stop_requested = False
        self._last_control = 0.0
        self._last_backpressure_check = 0.0
        self._next_batch_at = 0.0
        self._edge_lag = 0  # the largest produced - consumed over the output edges, last read
        self._written_since_check = 0
        self._last_handover_poll = 0.0
        self._release_requests: dict[int, int] = {}  # key group or source partition -> new owner

    # --- lifecycle -----------------------------------------------------------

    def restore(self) -> None:
        if self.source is not None:
            self.source.restore()
        if self.reader is not None:
            self.reader.restore()
        if self.stage is not None:
            since = self.prestaged.applied if self.prestaged is not None else None
            self._changelog_ids = recovery.restore(self.r, self.plan.keys, self.op, self.store, since)
            self.stage.restore(self.reader.key_group_watermarks())
        # Restarted after taking key groups over (or before saying so): the controller waits to hear it.
        moved_here = handover.moved_to(self.r, self.plan, self.op, self.instance)
        if moved_here:
            self.r.hset(self.plan.keys.acquired(self.op), mapping={kg: self.instance for kg in moved_here})

    def run(self, stop: threading.Event) -> None:
        self.restore()
        log.info("%s/%d owns %d key groups (incarnation %d%s)", self.op, self.instance, len(self.owned),
                 self.incarnation, ", state prestaged as a standby" if self.prestaged is not None else "")
        while not stop.is_set():
            self.step()

    # --- one micro-batch -----------------------------------------------------

    def step(self) -> None:
        if self._backpressured():
            pause = _SOURCE_TICK_S
            time.sleep(pause)
            self.metrics.backpressured_seconds.inc(pause)
            return
        started = time.monotonic()
        txn = Transaction()
        waited = 0.0
        if self.source is not None:
            records, output, watermark, waited = self._poll_source(txn)
            self.metrics.source_pending.set(self.source.pending)
            full = False
        else:
            if self.stage is not None:
                pause = max(0.0, self._next_batch_at - started)
                time.sleep(pause)
                self.metrics.idle_seconds.inc(pause)
                started = time.monotonic()
            batch = self.reader.read(self._entries_per_stream, self.plan.spec.batching.max_wait_ms)
            records, full = batch.records, batch.full
            self._dead_letter(batch, txn)
            watermark = self.reader.watermark
            output, watermark = self._process(batch, watermark, txn)
            self.reader.stage(txn)
        if self.router is not None:
            written = self.router.route(output, watermark, txn, time.time())
            self.metrics.records_out.inc(written)
            self._written_since_check += written
        if self.is_sink and watermark == MAX_WATERMARK and not self._done:
            txn.sadds.append((self.plan.keys.done(self.op), str(self.instance)))
            self._done = True
        for kg, changes in self.store.drain_changes().items():
            txn.changelog[kg] = changes
        released = self._handovers()
        if released:
            txn.hset(self.plan.keys.owners(self.op), released)
        if not txn.empty:
            ids = self.checkpoint.commit(txn)
            self._changelog_ids.update(ids)
            self._unsnapshotted.update(ids)
        if released:
            self._let_go(released)  # before any snapshot: the new owner's changelog is not ours to trim
        self._take_over()
        self._batches += 1
        if self._batches % self.plan.spec.state.snapshot_every_batches == 0 and self._unsnapshotted:
            self._snapshot()
        elapsed = time.monotonic() - started
        self.metrics.records_in.inc(records)
        self.metrics.watermark.set(min(watermark, 2**53))
        # A source's wait for records to fall due is idle time: DS2's true rate counts only useful time.
        self.metrics.idle_seconds.inc(waited if records else elapsed)
        if records:
            self.metrics.count_batch(records, elapsed - waited)
            self.metrics.batch_duration.observe(elapsed)
        self._adapt(records, elapsed, full)
        if records and not full:
            self._next_batch_at = started + self.plan.spec.batching.min_interval_ms / 1000
        self._report_lag()

    # --- per-key-group handover (fluid and batched rescales) ---------------------

    def _handovers(self) -> dict[int, int]:
        """Key groups to release with this batch's commit: new owner of each, asked for or at its markers."""
        asked = {kg: to for kg, to in self._release_requests.items() if kg in self.owned and to != self.instance}
        return asked if self.reader is None else {**self.reader.handovers(), **asked}

    def _let_go(self, released: dict[int, int]) -> None:
        for kg in released:
            if self.source is not None:
                self.source.release(kg)
            else:
                self.reader.release(kg)
                for edge in self.plan.edges_in(self.op):
                    self.metrics.drop_lag(edge.upstream, kg)
            if self.stage is not None:
                self.stage.release(kg)
            self.store.release(kg)
            self._changelog_ids.pop(kg, None)
            self._unsnapshotted.discard(kg)
            self._snapshot_sizes.pop(kg, None)
        self._owned_now(tuple(kg for kg in self.owned if kg not in released))
        log.info("%s/%d released key groups %s", self.op, self.instance, _pairs(released))

    def _take_over(self) -> None:
        """Take over the key groups released to this instance, from their last owner's commit."""
        now = time.monotonic()
        if now - self._last_handover_poll < _HANDOVER_POLL_S:
            return
        self._last_handover_poll = now
        keys = self.plan.keys
        self._release_requests = {int(kg): int(to) for kg, to in self.r.hgetall(keys.releases(self.op)).items()}
        mine = [kg for kg in handover.moved_to(self.r, self.plan, self.op, self.instance) if kg not in self.owned]
        if not mine:
            return
        for kg in mine:
            self.store.load(kg, ())
        if self.spec.type in STATEFUL_OPERATOR_TYPES:
            applied: dict[int, bytes] = {}
            recovery.catch_up(self.r, keys, self.op, self.store, applied, mine)
            self._changelog_ids.update(applied)
        if self.source is not None:
            self.source.acquire(mine)
        else:
            self.reader.acquire(mine)
        if self.stage is not None:
            watermarks = self.reader.key_group_watermarks()
            for kg in mine:
                self.stage.acquire(kg, watermarks[kg])
        self._owned_now(tuple(sorted({*self.owned, *mine})))
        self.r.hset(keys.acquired(self.op), mapping={kg: self.instance for kg in mine})
        log.info("%s/%d took over key groups %s", self.op, self.instance, mine)

    def _owned_now(self, owned: tuple[int, ...]) -> None:
        self.owned = owned
        if self.router is not None:
            self.router.speak_for(runs(owned))
        self.metrics.owned_key_groups.set(len(owned))

    def _backpressured(self) -> bool:
        """Whether an output edge holds more unconsumed records than the bound.

        Consumers only lower an edge's lag, so while the last reading plus what this instance wrote since
        stays under the bound the edges need no read; past it they are read before every batch, so that
        the edge overshoots by one batch at most. The 0.2 s reread sees what other instances wrote.
        """
        if self.router is None or self._done:
            return False
        bound = self.plan.spec.batching.max_lag_records
        now = time.monotonic()
        if self._edge_lag + self._written_since_check > bound or now - self._last_backpressure_check >= 0.2:
            self._last_backpressure_check = now
            totals = edge_totals(self.r, self.plan.keys, self.plan.edges_out(self.op))
            self._edge_lag = max(produced - consumed for produced, consumed in totals)
            self._written_since_check = 0
        return self._edge_lag > bound

    def _poll_source(self, txn: Transaction):
        now = time.time()
        if now - self._last_control >= 0.2:
            self._stop_requested = self.r.hget(self.plan.keys.control, "stop") is not None
            self._last_control = now
        table, watermark = self.source.poll(self._source_budget, now, self._stop_requested)
        polled = table.num_rows if table is not None else 0
        shedding_spec = getattr(self.spec, "load_shedding", None)
        if polled and shedding_spec is not None and self.source.pending > shedding_spec.max_backlog_records:
            table = self._shed(table, shedding_spec, txn)
        self.source.stage(txn)
        for stream, entry_id, error, record in self.source.bad:
            self._dead_letter_one(txn, stream, entry_id, error, json.dumps(record))
        self.source.bad.clear()
        waited = 0.0
        if not self.source.behind:
            # Not behind: gather a tick's worth of records per commit rather than a few per loop.
            waited = max(0.0, _SOURCE_TICK_S - (time.time() - now))
            time.sleep(waited)
        return polled, table, watermark, waited

    def _shed(self, table: pa.Table, shedding_spec, txn: Transaction) -> pa.Table:
        """Drop part of the batch; logged with the offsets it commits with, so it is never silent and an
        oracle repeats the choice."""
        mask = shedding.shed_mask(table, shedding_spec, self.source.ranges)
        shed = int(mask.sum())
        if shed:
            entry = shedding.log_entry(self.op, shed, table.num_rows - shed, self.source.ranges,
                                       self.source.shed_ids(mask))
            txn.xadd(self.plan.keys.shed, entry, 100_000)
            txn.hincrby(self.plan.keys.shed_totals, self.op, shed)
            self.metrics.shed_records.inc(shed)
        return table.filter(pa.array(~mask)) if shed < table.num_rows else None

    def _process(self, batch: InputBatch, watermark: int, txn: Transaction):
        if self.spec.simulated_cost_us and batch.records:
            # Sleeping, not spinning: on few cores, more instances then really add capacity.
            time.sleep(self.spec.simulated_cost_us * batch.records / 1e6)
        if self.sink is not None:
            for upstream in self.spec.inputs:
                table = batch.table(upstream)
                if table is not None:
                    self._observe_latency(table, txn)
                    self.sink.write(table, txn)
            return None, watermark
        if self.spec.on_error == "fail":
            output, out_watermark = self.stage.process(batch, watermark)
        else:
            output, out_watermark, rejected = poison.process(self.stage, batch, watermark)
            for bad in rejected:
                record = json.dumps(bad.record, default=str)
                self._dead_letter_one(txn, f"{bad.upstream}>{self.op}", b"", bad.error, record)
        if self.stage.late_records:
            self.metrics.late_records.inc(self.stage.late_records)
            self.stage.late_records = 0
        return output, out_watermark

    def _observe_latency(self, table, txn: Transaction) -> None:
        if "_ingest_ms" not in table.column_names:
            return
        ingest = table.column("_ingest_ms").to_numpy()
        step = max(1, len(ingest) // _LATENCY_SAMPLES)
        now_ms = time.time() * 1000
        sample = (now_ms - ingest[::step]).astype(int).tolist()
        for value in sample:
            self.metrics.latency.observe(value / 1000)
        txn.xadd(self.plan.keys.latency_samples, {"t": int(now_ms), "l": msgpack.packb(sample)}, 20_000)

    def _dead_letter(self, batch: InputBatch, txn: Transaction) -> None:
        for stream, entry_id, error in batch.bad:
            self._dead_letter_one(txn, stream, entry_id, error, "")

    def _dead_letter_one(self, txn: Transaction, stream: str, entry_id: bytes, error: str, record: str) -> None:
        txn.xadd(
            self.plan.keys.dead_letter,
            {"operator": self.op, "stream": stream, "id": entry_id, "error": error, "record": record},
            100_000,
        )
        self.metrics.dead_letters.inc()

    def _snapshot(self) -> None:
        kgs = sorted(self._unsnapshotted)
        for kg in kgs:
            self._snapshot_sizes[kg] = recovery.snapshot(
                self.r, self.plan.keys, self.op, self.store, self._changelog_ids, [kg]
            )
        self._unsnapshotted.clear()
        self.metrics.state_bytes.set(sum(self._snapshot_sizes.values()))

    def _adapt(self, records: int, elapsed: float, full: bool) -> None:
        target = self.plan.spec.batching.target_batch_ms / 1000
        if self.source is not None:
            limit = self.plan.spec.batching.max_records
            if self.source.behind and elapsed < target:
                self._source_budget = min(limit, self._source_budget * 2)
            elif elapsed > 2 * target:
                self._source_budget = max(self.plan.spec.batching.min_records, self._source_budget // 2)
            return
        # Under backlog a bigger batch costs little more than a small one (Spark's
        # fixed cost dominates), so grow while the batch stays within a few
        # targets; shrink only when a batch is both long and over maxRecords.
        if full and elapsed < 3 * target:
            self._entries_per_stream = min(_MAX_ENTRIES_PER_STREAM, self._entries_per_stream * 2)
        elif elapsed > 3 * target and records > self.plan.spec.batching.max_records:
            self._entries_per_stream = max(1, self._entries_per_stream // 2)

    def _report_lag(self) -> None:
        now = time.monotonic()
        if self.reader is None or now - self._last_lag < _LAG_EVERY_S:
            return
        self._last_lag = now
        for (upstream, kg), records in self.reader.lag().items():
            self.metrics.set_lag(upstream, kg, records)


def _pairs(released: dict[int, int]) -> str:
    return ", ".join(f"{kg}->{to}" for kg, to in sorted(released.items()))
