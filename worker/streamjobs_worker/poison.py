"""Records a stage fails on: found by splitting the batch, so that the rest of it goes on.

A batch can fail because of one record: a user function that raises on it, a
cast or a division Spark refuses (ANSI mode). Such a batch is split in halves,
and the halves that fail again, until the records that fail on their own are
known; they go to the dead-letter stream with the error, everything else is
processed as usual, with its state changes, in the same commit. The parts run
without advancing the watermark and one last call advances it, so no window
fires between two parts of one batch. When every record of a batch fails on
its own, no record is to blame (a wrong query, a broken function, a lost JVM):
the error is raised and the worker restarts.

Costs ~2 x log2(batch size) Spark jobs per bad record: fine for the rare
record, not for a stream of them (see the stage's onError: fail).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from py4j.protocol import Py4JNetworkError

from .inputs import MIN_WATERMARK, InputBatch

_ERROR_CHARS = 2000


@dataclass(frozen=True)
class Rejected:
    upstream: str
    record: dict
    error: str


class BatchFailed(RuntimeError):
    """Every record of the batch fails on its own: the stage or its environment is broken."""


def process(stage, batch: InputBatch, watermark: int) -> tuple[pa.Table | None, int, list[Rejected]]:
    """The stage's output and watermark for the batch, and the records it could not process."""
    try:
        output, out_watermark = stage.process(batch, watermark)
        return output, out_watermark, []
    except Exception as exc:  # what a stage raises is Spark's or the user's: any of it may be a record's fault
        if batch.records == 0 or _fatal(exc):
            raise
        first = exc
    outputs: list[pa.Table] = []
    rejected: list[Rejected] = []
    for half in split(batch):
        _isolate(stage, half, outputs, rejected)
    if len(rejected) == batch.records and batch.records > 1:
        raise BatchFailed(f"all {batch.records} records of the batch fail on their own: {describe(first)}") from first
    last, out_watermark = stage.process(InputBatch(watermarks=batch.watermarks), watermark)
    outputs += [last] if last is not None else []
    output = pa.concat_tables(outputs, promote_options="permissive") if outputs else None
    return output, out_watermark, rejected


def _isolate(stage, batch: InputBatch, outputs: list[pa.Table], rejected: list[Rejected]) -> None:
    if batch.records == 0:
        return
    try:
        output, _ = stage.process(batch, MIN_WATERMARK)  # MIN: the watermark stays where it was
    except Exception as exc:  # see process()
        if _fatal(exc):
            raise
        if batch.records == 1:
            upstream = next(iter(batch.tables))
            rejected.append(Rejected(upstream, batch.table(upstream).to_pylist()[0], describe(exc)))
            return
        for half in split(batch):
            _isolate(stage, half, outputs, rejected)
        return
    if output is not None:
        outputs.append(output)


def _fatal(exc: Exception) -> bool:
    """The JVM or the connection to it is gone: no record's fault, and no part can succeed now."""
    return isinstance(exc, (ConnectionError, Py4JNetworkError))


def split(batch: InputBatch) -> tuple[InputBatch, InputBatch]:
    """The batch's records in two halves (in upstream order), without its watermarks."""
    half, taken = batch.records // 2, 0
    left, right = InputBatch(), InputBatch()
    for upstream in batch.tables:
        table = batch.table(upstream)
        k = max(0, min(table.num_rows, half - taken))
        for part, piece in ((left, table.slice(0, k)), (right, table.slice(k))):
            if piece.num_rows:
                part.tables[upstream] = [piece]
                part.records += piece.num_rows
        taken += k
    return left, right


def describe(exc: BaseException) -> str:
    # A Python UDF's error arrives with the Python worker's traceback: its last line names the error.
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[-1].strip() if lines and "Traceback" in str(exc) else " ".join(lines)
    return f"{type(exc).__name__}: {text}"[:_ERROR_CHARS]
