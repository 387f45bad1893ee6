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

It is also the first place a mistake in the job shows, before any record is at stake: a query that does not
parse or names a column its input lacks, a function that does not import, an output without `event_time`
or without the column the next operator is keyed by. Such a mistake is the same on every batch, so no
restart mends it: `StageBroken` names the operator and the cause, and the job fails at once. Errors that
may depend on the records (a cast, a user function raising) are left to the real batches, which dead-letter
the records at fault.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
from pyspark.errors import AnalysisException
from streamjobs_core import ddl, generators
from streamjobs_core.codec import DecodeError, decode
from streamjobs_core.exchange import Streams
from streamjobs_core.plan import JobPlan
from streamjobs_core.watermarks import MAX_WATERMARK

from . import spark
from .inputs import InputBatch
from .ports import Ports
from .sources import with_ingest_time
from .stages import StageBroken, build_stage
from .state import open_store

log = logging.getLogger(__name__)

# A spare promoted after one rehearsal ran its first real batches 3-5x slower than a warm instance for
# ~10 s (its hot paths not yet compiled by the JIT, whose threads then compete with the busy job): moved
# key groups' results came up to 5 s late. After 30 rounds (~0.15 s each once the first is done) it ran as
# fast as the instances it joined. Spares rehearse at the job's start or on idle CPU, so the rounds are free.
SPARE_REHEARSALS = 30
SAMPLE_ENTRIES = 8
SAMPLE_RECORDS = 2000  # generated for a stage that reads a generator source while its streams are empty
# Stages whose query is the job's own (SQL, or built from the spec): Spark refusing it is the job's mistake.
# A user function's plan may depend on the records it is given, so its errors are left to the real batches.
_PLANNED = ("sql", "window_aggregate", "join", "over", "lookup")
_EVENT_TIME = ("window_aggregate", "join", "over")  # stages that keep time by their input's event_time




def sample(streams: Streams, plan: JobPlan, op: str) -> InputBatch:
    """The newest entries of the operator's kg streams (any owner's), up to SAMPLE_ENTRIES per input; for an
    input from a generator source with nothing in its streams yet (a job starting), records generated as
    that source will (its first ones)."""
    batch = InputBatch()
    for edge in plan.edges_in(op):
        taken = 0
        for newest in streams.newest([plan.keys.kg_stream(edge.upstream, op, kg) for kg in range(plan.key_groups(op))]):
            if newest is None:
                continue
            try:
                entry = decode(newest[1])
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
    if spec not in plan.spec.sources:
        return
    if spec.type == "redis_stream":
        _declared(spec, plan.t0_ms, batch)
        return
    table = generators.generate(spec, plan.t0_ms, np.arange(SAMPLE_RECORDS, dtype=np.int64))
    batch.tables.setdefault(source, []).append(with_ingest_time(table, plan.t0_ms))
    batch.records += SAMPLE_RECORDS


def _declared(spec, t0_ms: int, batch: InputBatch) -> None:
    """One record of an external source's declared schema (zeros and empty strings) while its input is empty:
    enough for Spark to plan the stages (a source without a schema has no columns known before its input)."""
    if not spec.schema_:
        return
    columns = {f.name: pa.array([_zero(f.type)], f.type) for f in ddl.parse(spec.schema_)}
    columns.update(event_time=pa.array([t0_ms], pa.int64()), _ingest_ms=pa.array([t0_ms], pa.int64()))
    batch.tables.setdefault(spec.name, []).append(pa.table(columns))
    batch.records += 1


def _zero(kind: pa.DataType):
    return "" if pa.types.is_string(kind) else False if pa.types.is_boolean(kind) else 0


def rehearse(ports: Ports, plan: JobPlan, op: str) -> int:
    """Run the instance's chain once on a sample of its input, every window fired, so each of its stages runs
    its own query; the records rehearsed (0 when there was nothing to rehearse on). StageBroken for a mistake
    in the job (see the module's docstring); a chain without stages only has its source's output checked."""
    chain = plan.chain(op)
    stages = [plan.spec.operator(m) for m in chain.operators if plan.spec.operator(m) in plan.spec.stages]
    head = plan.spec.operator(chain.head)
    if head in plan.spec.sources:
        batch = InputBatch()
        _generated(plan, chain.head, batch)
        if batch.records:
            _check_output(plan, head, batch.table(chain.head))
    elif stages:
        batch = sample(ports.exchange, plan, chain.head)
    if not stages or not batch.records:
        return 0
    scratch = open_store("memory", range(plan.spec.max_parallelism), "")
    rehearsed = batch.records
    for spec in stages:
        output = _stage_once(ports, plan, spec, scratch, batch)
        if output is None or not output.num_rows:
            return 0 if output is None else rehearsed
        _check_output(plan, spec, output)
        batch = InputBatch(tables={spec.name: [output]}, records=output.num_rows)
    return rehearsed


def _stage_once(ports: Ports, plan: JobPlan, spec, scratch, batch: InputBatch):
    """The stage's output for the sample (every window fired); None if it failed in a way records may cause."""
    stage = build_stage(spec, scratch, plan.spec.max_parallelism, ports.redis)
    try:
        stage.restore()
        return stage.process(batch, MAX_WATERMARK)[0]
    except AnalysisException as exc:
        if spec.type in _PLANNED:
            raise StageBroken(f"{spec.name}: Spark refuses its query: {_described(exc)}") from None
        log.info("rehearsal of %s failed (%s); the first batch will pay the warm-up", spec.name, exc)
    except Exception as exc:  # noqa: BLE001 - a rehearsal only warms; the real batch reports real errors
        log.info("rehearsal of %s failed (%s); the first batch will pay the warm-up", spec.name, exc)
    return None


def _check_output(plan: JobPlan, spec, output: pa.Table) -> None:
    """What the operators after a stage (or source) need of its output: event time where they keep time, and
    the columns they are keyed by."""
    columns = set(output.column_names)
    timed = [c.name for c in plan.spec.consumers(spec.name) if c.type in _EVENT_TIME]
    if timed and "event_time" not in columns:
        raise StageBroken(f"{spec.name}: its output has no column event_time, which {timed[0]} needs (a stage must "
                          f"carry it through, e.g. SELECT ..., event_time FROM input); it has {sorted(columns)}")
    for edge in plan.edges_out(spec.name):
        missing = [c for c in edge.key_by or () if c not in columns]
        if missing:
            raise StageBroken(f"{edge.downstream} is keyed by {missing[0]!r}, which the output of {spec.name} does "
                              f"not have (it has {sorted(c for c in columns if not c.startswith('_'))})")


def _described(exc: BaseException) -> str:
    """The error's first line; for Spark's parse errors also the query with its caret under the fault."""
    lines = [line.rstrip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0].strip() if lines else ""
    if "== SQL ==" in lines:
        at = lines.index("== SQL ==")
        text += "\n" + "\n".join(lines[at + 1 : at + 3])
    return f"{type(exc).__name__}: {text}"[:1500]


def warm_up(ports: Ports, plan: JobPlan, op: str, rounds: int = 1) -> None:
    """What an instance of `op`'s chain pays before its first batch: its SparkSession and `rounds` rehearsals."""
    if plan.runs_spark(op):
        spark.session()
        for _ in range(rounds):
            if not rehearse(ports, plan, op):
                break
