"""The operators one worker runs on each batch: its chain (core's chaining.py), head first.

The head's batch flows through every member in the same micro-batch and the
same commit: a stage's output is the next member's input, a chained sink writes
into the commit. Each member keeps its own metrics, committed counts,
dead letters and late records, so the job still shows every operator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa
from streamjobs_core.chaining import Chain
from streamjobs_core.deadletters import DeadLetter, Kind
from streamjobs_core.exchange import Transaction
from streamjobs_core.plan import JobPlan
from streamjobs_core.spec import STATEFUL_TYPES

from . import phases, poison
from .inputs import InputBatch
from .metrics import WorkerMetrics
from .sinks import make_sink
from .stages import build_stage
from .state import KeyGroupStore

_LATENCY_SAMPLES = 200


@dataclass
class _Member:
    op: str
    spec: Any
    metrics: WorkerMetrics
    stage: Any = None  # a stage's operator logic, on the worker's SparkSession
    sink: Any = None


class OperatorChain:
    def __init__(self, plan: JobPlan, chain: Chain, instance: int, store: KeyGroupStore,
                 metrics: WorkerMetrics, r=None) -> None:
        self._plan = plan
        self.chain = chain
        self._instance = instance
        self._store = store
        self._r = r
        self._metrics = metrics
        self.members = [self._member(op) for op in chain.operators]

    def _member(self, op: str) -> _Member:
        spec = self._plan.spec
        operator = spec.operator(op)
        member = _Member(op, operator, self._metrics if op == self.chain.head else self._metrics.follower(op))
        if operator in spec.sinks:
            member.sink = make_sink(self._plan, op, self._instance)
        elif operator in spec.stages:
            # Only a head can hold keyed state: a chained member is stateless (chaining.forward).
            member.stage = build_stage(operator, self._store, spec.max_parallelism, self._r)
        return member

    def switch(self, plan: JobPlan) -> dict[str, tuple[dict[int, int], int]]:
        """Run `plan` from the next batch on (a live reconfiguration): a changed stateless stage or sink is
        built anew, a changed stateful stage keeps its state and takes the new fields (reconfigure.py allows
        only those its state does not depend on), and a stage `plan` resets is built anew over an emptied
        state. Members `plan` adds to the chain are built, those it removes dropped (stateless: nothing of
        theirs is kept). Per stage reset: each owned key group's watermark then, and the rows dropped."""
        self._plan = plan
        self.chain = plan.chain(self.chain.head)
        kept = {member.op: member for member in self.members}
        self.members = [kept.get(op) or self._member(op) for op in self.chain.operators]
        reset = {}
        for member in self.members:
            operator = plan.spec.operator(member.op)
            if member.op in plan.resets and member.stage is not None:
                watermarks = member.stage.watermarks()  # what fired before: late records stay late
                dropped = self._store.reset()
                member.stage = build_stage(operator, self._store, plan.spec.max_parallelism, self._r)
                member.stage.restore(watermarks)
                member.spec = operator
                reset[member.op] = (watermarks, dropped)
                continue
            if operator == member.spec:
                continue
            if member.sink is not None:
                member.sink = make_sink(plan, member.op, self._instance)
            elif member.stage is not None and operator.type in STATEFUL_TYPES:
                member.stage.reconfigure(operator)
            elif member.stage is not None:
                member.stage = build_stage(operator, self._store, plan.spec.max_parallelism, self._r)
            member.spec = operator
        return reset

    @property
    def stages(self) -> list[Any]:
        return [m.stage for m in self.members if m.stage is not None]

    @property
    def sinks(self) -> list[str]:
        return [m.op for m in self.members if m.sink is not None]

    def process(self, batch: InputBatch, txn: Transaction) -> tuple[pa.Table | None, int]:
        """Run the batch through every member; the tail's output and watermark."""
        keys = self._plan.keys
        output, watermark = None, batch.watermark
        for i, member in enumerate(self.members):
            if i == 0 and member.stage is None and member.sink is None:  # a source: its input is its output
                output = batch.table(member.op)
                records_in = batch.records
            else:
                if i > 0:
                    batch = InputBatch(tables={self.members[i - 1].op: [output]} if output is not None else {},
                                       watermarks=batch.watermarks, records=output.num_rows if output else 0,
                                       watermark=watermark)
                records_in = batch.records
                output, watermark = self._run(member, batch, watermark, txn)
            written = output.num_rows if output is not None else 0
            member.metrics.records_in.inc(records_in)
            if member is not self.members[-1]:
                member.metrics.records_out.inc(written)  # the tail's are counted per edge as they are routed
            # Committed with the batch, so a replayed batch does not count twice (the run report reads these).
            if records_in:
                txn.hincrby(keys.counts, f"{member.op}:in", records_in)
            if written:
                txn.hincrby(keys.counts, f"{member.op}:out", written)
        return output, watermark

    def _run(self, member: _Member, batch: InputBatch, watermark: int, txn: Transaction):
        if member.spec.simulated_cost_us and batch.records:
            # Sleeping, not spinning: on few cores, more instances then really add capacity.
            time.sleep(member.spec.simulated_cost_us * batch.records / 1e6)
        if member.sink is not None:
            for upstream in member.spec.inputs:
                table = batch.table(upstream)
                if table is not None:
                    self._observe_latency(member, table, txn)
                    with phases.phase("encode"):
                        member.sink.write(table, txn)
            return None, watermark
        stage = member.stage
        if member.spec.on_error == "fail":
            output, out_watermark = stage.process(batch, watermark)
        else:
            output, out_watermark, rejected = poison.process(stage, batch, watermark)
            for bad in rejected:
                letter = DeadLetter.of(member.op, Kind.REJECTED, bad.error, bad.record, f"{bad.upstream}>{member.op}")
                dead_letter(txn, self._plan, letter, member.metrics)
        for late in stage.late:
            member.metrics.late_records.inc(late.rows.num_rows)
            for record, reason in zip(late.rows.to_pylist(), late.reasons):
                letter = DeadLetter.of(member.op, Kind.LATE, reason, record, f"{late.upstream}>{member.op}")
                dead_letter(txn, self._plan, letter, member.metrics)
        stage.late.clear()
        return output, out_watermark

    def _observe_latency(self, member: _Member, table: pa.Table, txn: Transaction) -> None:
        if "_ingest_ms" not in table.column_names or not table.num_rows:
            return
        ingest = table.column("_ingest_ms").to_numpy()
        step = max(1, len(ingest) // _LATENCY_SAMPLES)
        now_ms = time.time() * 1000
        sample = (now_ms - ingest[::step]).astype(int).tolist()
        for value in sample:
            member.metrics.latency.observe(value / 1000)
        txn.xadd(self._plan.keys.latency_samples, {"t": int(now_ms), "l": msgpack.packb(sample)}, 20_000)


def dead_letter(txn: Transaction, plan: JobPlan, letter: DeadLetter, metrics: WorkerMetrics) -> None:
    """A record the operator could not take, with why: into the dead-letter stream, counted per operator."""
    keys = plan.keys
    txn.xadd(keys.dead_letter, letter.encode(), 100_000)
    txn.hincrby(keys.dead_letter_totals, letter.operator, 1)
    txn.hincrby(keys.dead_letter_totals, f"{letter.operator}:{letter.kind.value}", 1)
    metrics.dead_letters.inc()
