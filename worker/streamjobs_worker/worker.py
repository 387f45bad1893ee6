"""One instance of a chain of operators: input -> chain -> route -> checkpoint, in a loop.

A worker starts from "you own key groups X at epoch E" (the assignment in
Redis, and any key groups a fluid or batched rescale moved since: handover.py),
restores their state and offsets, and then each step reads its input (its
source, or its kg streams: an idle instance blocks until an entry arrives),
decides whether the batch is due (pacing.py), runs it through its chain of
operators on Spark (chain.py), routes the tail's output to the downstream kg
streams and commits it all at once (transaction.py's Checkpoint).

Under backlog batches grow until one takes about targetBatchMs, so Spark's
fixed cost per job is amortised. During a fluid or batched rescale a worker
releases a key group in the commit of the batch that reached its handover
markers (or in its next commit when the controller asks, as it does for source
partitions and backlogged owners), and takes over the key groups released to
it between batches.
"""

from __future__ import annotations

import logging
import threading
import time

from streamjobs_core.control import InstanceAddress, as_text
from streamjobs_core.deadletters import DeadLetter, Kind
from streamjobs_core.exchange import Transaction
from streamjobs_core.keygroups import runs
from streamjobs_core.plan import JobPlan, edge_totals
from streamjobs_core.reconfigure import holds_back, plan_in_force
from streamjobs_core.spec import STATEFUL_TYPES
from streamjobs_core.watermarks import MAX_WATERMARK, MIN_WATERMARK

from . import controlhandlers, phases, recovery
from .chain import OperatorChain, dead_letter
from .controlhandlers import ControlContext
from .inputs import InputBatch, open_input
from .metrics import WorkerMetrics
from .outputs import OutputRouter
from .ownership import Ownership
from .pacing import Pacing
from .ports import Ports
from .quarantine import Quarantine
from .rehearsal import rehearse
from .standby import Prestaged, state_directory
from .state import open_store
from .transaction import Checkpoint

log = logging.getLogger(__name__)

_LAG_EVERY_S = 1.0
_BACKPRESSURE_PAUSE_S = 0.05


class NotAChainHead(ValueError):
    """A chained operator has no workers of its own: its chain's head runs it."""


class Retired(RuntimeError):
    """The key groups of this chain switched to a plan version that removed it: it has nothing left to do."""


class Worker:
    def __init__(
        self, ports: Ports, plan: JobPlan, op: str, instance: int, metrics_host: str = "127.0.0.1",
        metrics_port: int = 0, advertise_host: str | None = None, prestaged: Prestaged | None = None,
        warm: bool = False,
    ) -> None:
        chain = plan.chain(op)
        if chain.head != op:
            raise NotAChainHead(f"'{op}' runs in the workers of '{chain.head}', chained after it "
                                f"({' -> '.join(chain.operators)}); set chain: false on it to run it on its own")
        self.jobs = jobs = ports.jobs
        self.exchange = exchange = ports.exchange
        self.op = op
        self.instance = instance
        assignment = jobs.assignment(op) or plan.initial_assignment(op)
        self.ownership = Ownership(jobs, plan, op, instance)
        # Mid-reconfiguration, the key groups may not have switched to the latest plan yet; its chain may
        # have other members then.
        self.plan = plan = plan_in_force(jobs, plan, op, self.ownership.owned)
        if op not in plan.vertices:
            raise Retired(f"{op}/{instance}: its key groups switched to plan version {plan.version}, which removed it")
        chain = plan.chain(op)
        self.spec = plan.spec.operator(op)
        self.incarnation = jobs.new_incarnation(op, instance)
        self.metrics = WorkerMetrics(plan.id, op, instance)
        self.metrics.owned_key_groups.set(len(self.owned))
        self.metrics.assignment_epoch.set(assignment.epoch)
        if prestaged is not None and set(prestaged.store.key_groups) != set(self.owned):
            prestaged = None  # prestaged for an assignment that is not the one in force
        self.prestaged = prestaged
        self.store = prestaged.store if prestaged is not None else open_store(
            plan.spec.state.backend, self.owned, state_directory(plan, op, instance, assignment.epoch))
        self.input = open_input(ports, plan, op, instance, self.owned, self.metrics, self._holds_back)
        self.quarantine = Quarantine(jobs, op, instance, plan.spec.restarts, self.input.isolates)
        self.input.restore()
        # Counted before the rehearsal: a worker that dies in it (a function that crashes on any record) counts.
        self._suspect = self.quarantine.started(self.input.positions())
        self.chain = OperatorChain(plan, chain, instance, self.store, self.metrics, ports.redis)
        edges = plan.edges_out(chain.tail)
        self.router = OutputRouter(plan, chain.tail, runs(self.owned)) if edges else None
        self.checkpoint = Checkpoint(exchange, plan.keys, op, instance, self.incarnation, self.store,
                                     plan.spec.state.snapshot_every_batches)
        self.pacing = Pacing(plan.spec.batching, self.spec, runs_spark=bool(self.chain.stages))
        if not warm:  # a standby or a spare rehearsed while it waited
            rehearse(ports, plan, op)
        # Registering the endpoint tells the runtime this instance is ready (Spark is up).
        port = self.metrics.serve(host=metrics_host, port=metrics_port)
        # In a pod the server listens on every interface; others reach it at the pod's IP.
        jobs.register(InstanceAddress(op, instance, f"{advertise_host or metrics_host}:{port}"))

        self._pending: InputBatch | None = None  # read, not yet processed: its batch is not due yet
        self._pending_busy_s = 0.0
        self._done: set[str] = set()  # chained sinks that saw the end of their input
        self._last_lag = 0.0
        self._last_backpressure_check = 0.0
        self._edge_lag = 0  # the largest produced - consumed over the output edges, last read
        self._written_since_check = 0
        self.retired = False  # switched to a plan version without this chain: waits to be stopped

    # --- lifecycle -----------------------------------------------------------

    def restore(self) -> tuple[str, str] | None:
        """Rebuild from the last commits (the input's offsets were read at the start); the entry to quarantine
        first, if one is to blame (quarantine.py)."""
        suspect, self._suspect = self._suspect, None
        if self.spec.type in STATEFUL_TYPES:
            since = self.prestaged.applied if self.prestaged is not None else None
            self.checkpoint.changelog_ids = recovery.restore(self.exchange, self.plan.keys, self.op, self.store, since)
        for stage in self.chain.stages:
            stage.restore(self.input.key_group_watermarks())
        self.ownership.resumed()
        return suspect

    def run(self, stop: threading.Event) -> None:
        suspect = self.restore()
        log.info("%s/%d owns %d key groups (incarnation %d%s)", self.op, self.instance, len(self.owned),
                 self.incarnation, ", state prestaged as a standby" if self.prestaged is not None else "")
        try:
            if suspect is not None:
                self._quarantine(*suspect)
            while not stop.is_set():
                self.step()
        except BaseException as exc:
            self.quarantine.died(exc)
            raise
        self.quarantine.stopped()

    def _quarantine(self, stream: str, entry_id: str) -> None:
        """Commit the entry a worker kept dying at as a dead letter, and the offset past it."""
        record = self.input.skip(stream, entry_id.encode())
        cause = self.quarantine.cause or "no error was written (the worker was killed, or crashed in native code)"
        letter = DeadLetter.of(self.op, Kind.QUARANTINED, f"quarantined: a worker died processing this entry alone, "
                               f"{self.plan.spec.restarts.quarantine_after} times at its batch before: {cause}",
                               record, stream, entry_id.encode())
        txn = Transaction()
        dead_letter(txn, self.plan, letter, self.metrics)
        self.input.add_progress(txn)
        self.checkpoint.complete(txn, {}, self._let_go)
        self.quarantine.quarantined()
        log.warning("%s/%d quarantined entry %s of %s: %s", self.op, self.instance, entry_id, stream, cause)

    def close(self) -> None:
        """After `run`: a demoted instance lives on as a spare, so what the instance held is let go."""
        self.metrics.close()
        self.store.close()

    # --- one micro-batch: input -> chain -> route -> checkpoint ----------------

    def step(self) -> None:
        """Read what arrived; when the batch read so far is due, process, route and commit it."""
        if self.retired:
            time.sleep(_BACKPRESSURE_PAUSE_S)
            return
        if self._backpressured():
            time.sleep(_BACKPRESSURE_PAUSE_S)
            self.metrics.backpressured_seconds.inc(_BACKPRESSURE_PAUSE_S)
            return
        started = time.monotonic()
        before = self.input.positions() if self.quarantine.watching else {}
        isolated = self._isolated_stream(before)
        batch, waited = self._read() if isolated is None else (self.input.read_one(isolated), 0.0)
        if isolated is not None and self.input.positions()[isolated] == before[isolated]:
            self.quarantine.read_nothing(isolated)  # its noted entries are gone: nothing left to isolate there
            return
        read_s = time.monotonic() - started
        if batch.records or batch.bad:
            self._pending_busy_s += max(0.0, read_s - waited)
            self.metrics.idle_seconds.inc(waited)
        else:
            self.metrics.idle_seconds.inc(read_s)
        releases = self._handovers()
        switch_to = self.input.aligned()
        due = isolated is not None or self.input.due(self.pacing, batch, bool(releases) or switch_to is not None,
                                                     time.monotonic()) or self._holds_back_producers(batch)
        if switch_to is None and self.input.holding:
            return  # holding back until every producer passed its reconfiguration barrier
        if not due:
            self._take_over()
            return
        self._pending = None
        if isolated is not None:
            self.quarantine.processing(isolated, self.input.positions()[isolated], before)
        elif self.quarantine.watching:
            self.quarantine.reading(self.input.positions(), before)
        began = time.monotonic()
        txn = Transaction()
        for letter in batch.bad:
            dead_letter(txn, self.plan, letter, self.metrics)
        watermark = self._process(batch, txn)
        records = batch.records
        if switch_to is not None:
            before_ms = (time.monotonic() - began) * 1000
            held_ms = self._switch(switch_to, txn)
            switched = time.monotonic()
            if batch.post is not None:
                watermark = self._process(self._post(batch.post), txn)
                records += batch.post.records
            after = (batch.post.records if batch.post else 0, (time.monotonic() - switched) * 1000)
            txn.after_commit.append(lambda: log.info(
                "%s/%d switched to plan version %d: input held back %.0f ms; %d records before the cut took %.0f "
                "ms, %d after it %.0f ms", self.op, self.instance, switch_to, held_ms, batch.records, before_ms,
                *after))
        self.input.add_progress(txn)
        self._end_of_input(watermark, txn)
        with phases.phase("commit"):
            if releases:
                self.ownership.release_in(txn, releases)
            snapshot_bytes = self.checkpoint.complete(txn, releases, self._let_go)
        if records or batch.bad:
            self.quarantine.committed()  # input consumed: a start after this one counts from one
        if snapshot_bytes is not None:
            self.metrics.state_bytes.set(snapshot_bytes)
        self._take_over()
        busy = self._pending_busy_s + time.monotonic() - began
        self._pending_busy_s = 0.0
        self.metrics.watermark.set(min(batch.watermark, 2**53))
        if records:
            self.metrics.count_batch(records, busy)
            self.metrics.batch_duration.observe(busy)
        else:
            self.metrics.idle_seconds.inc(busy)  # a watermark-only batch: bookkeeping, not useful work
        self.pacing.ran(batch, busy, time.monotonic())
        self.input.adapt(batch, busy, self.plan.spec.batching)
        self._report_lag()

    def _process(self, batch: InputBatch, txn: Transaction) -> int:
        """Run the batch through the chain and route the tail's output; the output watermark."""
        output, watermark = self.chain.process(batch, txn)
        if self.router is not None:
            written = self.router.route(output, watermark, txn)
            self.metrics.records_out.inc(written)
            self._written_since_check += written
        return watermark

    # --- live reconfiguration (streamjobs_core.reconfigure) ----------------------

    def _switch(self, version: int, txn: Transaction) -> float:
        """Between the batch's part under the old plan and its part under `version`: barriers downstream, then
        the new plan, and the switch of the owned key groups (a source's: with their offsets, the cut)
        recorded in the same commit. Returns how long the input was held back for it (ms)."""
        held_ms = (time.monotonic() - self.input.aligning_since) * 1000 if self.input.holding else 0.0
        if self.router is not None:
            self.router.barrier(version, txn)
        plan = self.jobs.plan_version(version)
        if self.op not in plan.vertices:
            return self._retire(version, held_ms, txn)
        self.plan, self.spec = plan, plan.spec.operator(self.op)
        for op, (watermarks, dropped) in self.chain.switch(plan).items():
            self.jobs.record_reset(txn, op, version, watermarks)
            txn.after_commit.append(lambda op=op, dropped=dropped: log.info(
                "%s/%d reset the state of %s at plan version %d: %d rows dropped", self.op, self.instance, op,
                version, dropped))
        if self.router is not None:
            self.router = OutputRouter(plan, self.chain.chain.tail, runs(self.owned))
        self.pacing = Pacing(plan.spec.batching, self.spec, runs_spark=bool(self.chain.stages))
        self.checkpoint.snapshot_every = plan.spec.state.snapshot_every_batches
        self.jobs.record_versions(txn, self.op, self.owned, version)
        self.jobs.record_cut(txn, self.op, version, self.input.offsets())
        self.jobs.record_aligned(txn, self.op, self.instance, version, held_ms)
        if plan.control is not None and plan.control.operator in self.chain.chain.operators:
            self._answer(plan, txn)
        self.input.switch(plan, txn)
        return held_ms

    def _retire(self, version: int, held_ms: float, txn: Transaction) -> float:
        """The chain is gone from plan `version`: its barriers went downstream, and its producers write to
        the streams of what replaced it from their own; its key groups record the switch, and it waits."""
        self.jobs.record_versions(txn, self.op, self.owned, version)
        self.jobs.record_cut(txn, self.op, version, self.input.offsets())
        self.jobs.record_aligned(txn, self.op, self.instance, version, held_ms)
        self.retired = True
        txn.after_commit.append(lambda: log.info("%s/%d passed plan version %d on, which removed it: waiting to be "
                                                 "stopped", self.op, self.instance, version))
        return held_ms

    def _holds_back(self, version: int) -> bool:
        return holds_back(self.plan, self.jobs.plan_version(version), self.chain.chain.operators)

    def _answer(self, plan: JobPlan, txn: Transaction) -> None:
        """Run the control event `plan` carries at this sync point; its reply commits with the switch."""
        event = plan.control
        offsets = {p: as_text(o) if isinstance(o, bytes) else str(o) for p, o in self.input.offsets().items()}
        context = ControlContext(event.operator, self.instance, plan.version, event.args, self.owned,
                                 self.input.key_group_watermarks(), self.input.records_read(), offsets, self.store)
        self.jobs.record_reply(txn, event.id, event.operator, self.instance, controlhandlers.reply(event, plan, context))

    def _post(self, post: InputBatch) -> InputBatch:
        """What producers wrote after their barriers, with the watermarks they wrote with it."""
        post.watermarks = self.input.key_group_watermarks()
        post.watermark = min(post.watermarks.values(), default=MIN_WATERMARK)
        return post

    def _isolated_stream(self, positions: dict[str, bytes]) -> str | None:
        """Isolating the entries a worker died at: the stream to read one entry of (none pending from before)."""
        if not self.quarantine.isolating or self._pending is not None:
            return None
        return self.quarantine.next_stream(positions)

    def _read(self) -> tuple[InputBatch, float]:
        """The input read so far: what was pending, and what arrived since (waiting at most until it is due);
        and how long this read waited."""
        read = self.input.read(self.input.wait_ms(self.pacing, self._pending, time.monotonic()))
        batch = read
        if self._pending is not None:
            self._pending.absorb(read)
            batch = self._pending
        self._pending = batch
        return batch, read.waited_s

    def _end_of_input(self, watermark: int, txn: Transaction) -> None:
        """A chained sink that saw the end-of-stream watermark says so (the runtime waits for every one)."""
        if watermark != MAX_WATERMARK:
            return
        for sink in self.chain.sinks:
            if sink not in self._done:
                txn.sadds.append((self.plan.keys.done(sink), str(self.instance)))
                self._done.add(sink)

    # --- per-key-group handover (fluid and batched rescales) ---------------------

    def _handovers(self) -> dict[int, int]:
        """Key groups to release with this batch's commit: new owner of each, asked for or at its markers."""
        return self.ownership.releases(self.input.handovers())

    def _let_go(self, released: dict[int, int]) -> None:
        for kg in released:
            self.input.release(kg)
            for edge in self.plan.edges_in(self.op):  # a source has none
                self.metrics.drop_lag(edge.upstream, kg)
            for stage in self.chain.stages:
                stage.release(kg)
            self.store.release(kg)
        self.ownership.released(released)
        self._owned_now()
        log.info("%s/%d released key groups %s", self.op, self.instance, _pairs(released))

    def _take_over(self) -> None:
        """Take over the key groups released to this instance, from their last owner's commit."""
        mine = self.ownership.arrivals()
        if not mine:
            return
        for kg in mine:
            self.store.load(kg, ())
        if self.spec.type in STATEFUL_TYPES:
            applied: dict[int, bytes] = {}
            recovery.catch_up(self.exchange, self.plan.keys, self.op, self.store, applied, mine)
            self.checkpoint.changelog_ids.update(applied)
        self.input.acquire(mine)
        watermarks = self.input.key_group_watermarks()
        for stage in self.chain.stages:
            for kg in mine:
                stage.acquire(kg, watermarks[kg])
        self.ownership.taken_over(mine)
        self._owned_now()
        log.info("%s/%d took over key groups %s", self.op, self.instance, mine)

    @property
    def owned(self) -> tuple[int, ...]:
        return self.ownership.owned

    def _owned_now(self) -> None:
        if self.router is not None:
            self.router.speak_for(runs(self.owned))
        self.metrics.owned_key_groups.set(len(self.owned))

    def _backpressured(self) -> bool:
        """Whether an output edge holds more unconsumed records than the bound.

        Consumers only lower an edge's lag, so while the last reading plus what this instance wrote since
        stays under the bound the edges need no read; past it they are read before every batch, so that
        the edge overshoots by one batch at most. The 0.2 s reread sees what other instances wrote.
        """
        if self.router is None:
            return False
        bound = self.plan.spec.batching.max_lag_records
        now = time.monotonic()
        if self._edge_lag + self._written_since_check > bound or now - self._last_backpressure_check >= 0.2:
            self._last_backpressure_check = now
            totals = edge_totals(self.exchange, self.plan.keys, self.plan.edges_out(self.chain.chain.tail))
            self._edge_lag = max(produced - consumed for produced, consumed in totals)
            self._written_since_check = 0
        return self._edge_lag > bound

    def _holds_back_producers(self, batch: InputBatch) -> bool:
        """Whether an input edge holds more unconsumed records than the lag bound. Its producers pause until a
        consumer commits (_backpressured), so a batch waiting to fill up would only leave the pipeline idle.
        Asked on every read while a batch waits: reading the edges only every 0.1 s may hold a batch that long,
        as much as a 2-core `bench throughput` batch takes."""
        if not batch.records:
            return False
        edges = self.plan.edges_in(self.chain.chain.head)  # a source has none
        bound = self.plan.spec.batching.max_lag_records
        totals = edge_totals(self.exchange, self.plan.keys, edges)
        return any(produced - consumed > bound for produced, consumed in totals)

    def _report_lag(self) -> None:
        now = time.monotonic()
        if now - self._last_lag < _LAG_EVERY_S:
            return
        self._last_lag = now
        for (upstream, kg), records in self.input.lag().items():
            self.metrics.set_lag(upstream, kg, records)


def _pairs(released: dict[int, int]) -> str:
    return ", ".join(f"{kg}->{to}" for kg, to in sorted(released.items()))

