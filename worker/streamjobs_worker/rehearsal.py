"""Rehearse a stage on records already in its input streams before the instance says it is ready.

A fresh JVM's first real batch pays for planning and compiling the stage's own
query and for the JIT of its code paths: seconds on a busy machine, far more
than the warm-up's toy query. In a fluid or batched scale-out that first batch
runs right after the new instance's first take-over and delays the next one;
after an all_at_once switch it delays every moved key group. Running the stage
once on a sample peeked (not consumed) from its input streams, with a store
that is thrown away, moves that cost before the instance registers as ready:
off the handover's critical path.
"""

from __future__ import annotations

import logging

from streamjobs_core.codec import DecodeError, decode
from streamjobs_core.plan import JobPlan

from .inputs import MIN_WATERMARK, InputBatch
from .stages import make_stage
from .state import open_store

log = logging.getLogger(__name__)

SAMPLE_ENTRIES = 8


def sample(r, plan: JobPlan, op: str) -> InputBatch:
    """The newest entries of the operator's kg streams (any owner's), up to SAMPLE_ENTRIES per input."""
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
    return batch


def rehearse(r, plan: JobPlan, op: str) -> int:
    """Run the stage once on a sample of its input; the records rehearsed (0 when its streams are empty)."""
    if plan.spec.operator(op) not in plan.spec.stages:
        return 0  # sources and sinks run no stage query
    batch = sample(r, plan, op)
    if not batch.records:
        return 0
    scratch = open_store("memory", range(plan.spec.max_parallelism), "")
    stage = make_stage(plan.spec.operator(op), scratch, plan.spec.max_parallelism)
    try:
        stage.process(batch, MIN_WATERMARK)
    except Exception as exc:  # noqa: BLE001 - a rehearsal only warms; the real batch reports real errors
        log.info("%s: rehearsal on %d sampled records failed (%s); the first batch will pay the warm-up",
                 op, batch.records, exc)
        return 0
    return batch.records
