"""Rehearse an instance's chain of stages on a sample of its input before the instance says it is ready.

A fresh JVM's first real batch pays for planning and compiling the stage's own
query and for the JIT of its code paths: seconds on a busy machine, far more
than the warm-up's toy query. In a fluid or batched scale-out that first batch
runs right after the new instance's first take-over and delays the next one;
after an all_at_once switch it delays every moved key group; at a job's start
it puts the whole job behind by seconds. Running the chain once on a sample
peeked (not consumed) from its input streams, or generated as its generator
source will generate it when those are still empty, with every window fired
so each chained stage runs its query too, and with a store that is thrown
away, moves that cost before the instance registers as ready.
"""

from __future__ import annotations

import logging

import numpy as np
from streamjobs_core import generators
from streamjobs_core.codec import DecodeError, decode
from streamjobs_core.plan import JobPlan
from streamjobs_core.watermarks import MAX_WATERMARK

from . import spark
from .inputs import InputBatch
from .sources import with_ingest_time
from .stages import make_stage
from .state import open_store

log = logging.getLogger(__name__)

# A spare promoted after one rehearsal ran its first real batches 3-5x slower than a warm instance for
# ~10 s (its hot paths not yet compiled by the JIT, whose threads then compete with the busy job): moved
# key groups' results came up to 5 s late. After 30 rounds (~0.15 s each once the first is done) it ran as
# fast as the instances it joined. Spares rehearse at the job's start or on idle CPU, so the rounds are free.
SPARE_REHEARSALS = 30
SAMPLE_ENTRIES = 8
SAMPLE_RECORDS = 2000  # generated for a stage that reads a generator source while its streams are empty


def sample(r, plan: JobPlan, op: str) -> InputBatch:
    """The newest entries of the operator's kg streams (any owner's), up to SAMPLE_ENTRIES per input; for an
    input from a generator source with nothing in its streams yet (a job starting), records generated as
    that source will (its first ones)."""
    batch = InputBatch()
    for edge in plan.edges_in(op):
        pipe = r.pipeline(transaction=False)
        for kg in range(plan.key_groups(op)):
            pipe.xrevrange(plan.keys.kg_stream(edge.upstream, op, kg), count=1)
        taken = 0
        for entries in pipe.execute():
            for _, fields in entries:
                try:
                    entry = decode(fields)
                except DecodeError:
                    continue
                if entry.table is not None and entry.table.num_rows and taken < SAMPLE_ENTRIES:
                    batch.tables.setdefault(edge.upstream, []).append(entry.table)
                    batch.records += entry.table.num_rows
                    taken += 1
        if not taken:
            _generated(plan, edge.upstream, batch)
    return batch


def _generated(plan: JobPlan, source: str, batch: InputBatch) -> None:
    spec = plan.spec.operator(source)
    if spec not in plan.spec.sources or spec.type == "redis_stream":
        return
    table = generators.generate(spec, plan.t0_ms, np.arange(SAMPLE_RECORDS, dtype=np.int64))
    batch.tables.setdefault(source, []).append(with_ingest_time(table, plan.t0_ms))
    batch.records += SAMPLE_RECORDS


def rehearse(r, plan: JobPlan, op: str) -> int:
    """Run the instance's chain once on a sample of its input, every window fired, so each of its stages runs
    its own query; the records rehearsed (0 when there was nothing to rehearse on)."""
    chain = plan.chain(op)
    stages = [plan.spec.operator(m) for m in chain.operators if plan.spec.operator(m) in plan.spec.stages]
    if not stages:
        return 0  # sources and sinks run no stage query
    head = plan.spec.operator(chain.head)
    if head in plan.spec.sources:
        batch = InputBatch()
        _generated(plan, chain.head, batch)
    else:
        batch = sample(r, plan, chain.head)
    if not batch.records:
        return 0
    scratch = open_store("memory", range(plan.spec.max_parallelism), "")
    upstream, rehearsed = chain.head, batch.records
    try:
        for spec in stages:
            stage = make_stage(spec, scratch, plan.spec.max_parallelism, r)
            stage.restore()
            output, _ = stage.process(batch, MAX_WATERMARK)
            if output is None or not output.num_rows:
                break
            upstream = spec.name
            batch = InputBatch(tables={upstream: [output]}, records=output.num_rows)
    except Exception as exc:  # noqa: BLE001 - a rehearsal only warms; the real batch reports real errors
        log.info("%s: rehearsal of %s failed (%s); the first batch will pay the warm-up", op, upstream, exc)
        return 0
    return rehearsed


def warm_up(r, plan: JobPlan, op: str, rounds: int = 1) -> None:
    """What an instance of `op`'s chain pays before its first batch: its SparkSession and `rounds` rehearsals."""
    if plan.runs_spark(op):
        spark.session()
        for _ in range(rounds):
            if not rehearse(r, plan, op):
                break
