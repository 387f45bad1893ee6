"""Records a stage fails on: found in few Spark jobs, so that the rest of the batch goes on.

A batch can fail because of some of its records: a cast or a division Spark
refuses (ANSI mode), a user function that raises on them. When Spark's error
names the SQL expression that raised, one probe over the batch finds every
record it raises on (probes.py); they are set aside and the rest is run again,
a few rounds for as many different expressions. The probes a stage needed are
remembered, and a later batch is probed before the stage runs: a stream with a
steady share of bad records costs one probe (no Spark job) and one run per
batch. When the error names no expression (a Python UDF's), or a probe
explains nothing, group testing finds the records (`_Isolation.search`). The
records the stage fails on alone go to the dead-letter stream with their
error; everything else is processed as usual, with its state changes, in the
same commit.

Parts run without advancing the watermark and one last call advances it, so
no window fires between two parts of one batch. A batch whose every record
fails on its own has every record dead-lettered: that is what onError:
dead_letter promises (onError: fail stops instead). When the stage's query
cannot even be planned for the batch, no record is to blame (a wrong query):
BatchFailed is raised; the start-up rehearsal (rehearsal.py) fails the job
on such a query before any batch. A lost JVM, or Redis, is raised as it is,
at once.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from weakref import WeakKeyDictionary

import numpy as np
import pyarrow as pa
from pyspark.errors import AnalysisException
from streamjobs_core.watermarks import MIN_WATERMARK

from . import probes
from .inputs import InputBatch
from .probes import Probe

log = logging.getLogger(__name__)

_ERROR_CHARS = 2000
_PROBE_ROUNDS = 4  # different failing expressions probed per batch; then group testing
_REMEMBERED = 4  # probes kept per stage
_FORGET_AFTER = 8  # batches in a row in which a remembered probe flagged nothing


@dataclass(frozen=True)
class Rejected:
    upstream: str
    record: dict
    error: str


class BatchFailed(RuntimeError):
    """The stage cannot plan the batch, whatever its records: its query is broken."""


@dataclass
class _Memory:
    """The probes that found one stage's bad records in its recent batches."""

    idle: dict[Probe, int] = field(default_factory=dict)  # probe -> batches in a row it flagged nothing

    def remember(self, probe: Probe) -> None:
        self.idle.pop(probe, None)
        self.idle[probe] = 0
        while len(self.idle) > _REMEMBERED:
            del self.idle[next(iter(self.idle))]

    def distrust(self, probe: Probe) -> None:
        self.idle.pop(probe, None)
        self.remember(replace(probe, trusted=False))

    def seen(self, flagged: dict[int, Probe]) -> None:
        hits = set(flagged.values())
        for probe in list(self.idle):
            self.idle[probe] = 0 if probe in hits else self.idle[probe] + 1
            if self.idle[probe] > _FORGET_AFTER:
                del self.idle[probe]


_memories: WeakKeyDictionary = WeakKeyDictionary()


def process(stage, batch: InputBatch, watermark: int) -> tuple[pa.Table | None, int, list[Rejected]]:
    """The stage's output and watermark for the batch, and the records it could not process."""
    if batch.records == 0:
        output, out_watermark = stage.process(batch, watermark)
        return output, out_watermark, []
    memory = _memories.setdefault(stage, _Memory())
    records = _Records(batch) if memory.idle else None  # numbered only when a probe or isolation needs them
    flagged = probes.find(stage, list(memory.idle), records.parts(records.all)) if records is not None else {}
    memory.seen(flagged)
    first = None
    if not flagged:
        try:
            output, out_watermark = stage.process(batch, watermark)
            return output, out_watermark, []
        except Exception as exc:  # what a stage raises is Spark's or the user's: any of it may be a record's fault
            if probes.outage(exc):
                raise
            if _unplannable(stage, exc):
                raise BatchFailed(f"the stage cannot plan the batch, whatever its records: {describe(exc)}") from exc
            first = exc
            log.warning("a batch of %d records failed (%s); finding the records it fails on", batch.records,
                        describe(exc), exc_info=True)
    isolation = _Isolation(stage, records if records is not None else _Records(batch), memory)
    isolation.run(flagged, first)
    last, out_watermark = stage.process(replace(batch, tables={}, records=0), watermark)
    outputs = isolation.outputs + ([last] if last is not None else [])
    output = pa.concat_tables(outputs, promote_options="permissive") if outputs else None
    return output, out_watermark, isolation.rejected


class _Isolation:
    """One batch's search for the records its stage fails on; every other record is processed once."""

    def __init__(self, stage, records: _Records, memory: _Memory) -> None:
        self.stage = stage
        self.records = records
        self.memory = memory
        self.outputs: list[pa.Table] = []
        self.rejected: list[Rejected] = []

    def run(self, flagged: dict[int, Probe], failure: Exception | None) -> None:
        """`flagged`: records remembered probes set aside; `failure`: what running all the others raised."""
        suspects = dict(flagged)
        pending = np.setdiff1d(self.records.all, np.fromiter(flagged, np.int64, len(flagged)))
        learned: set[Probe] = set()
        for round_ in range(_PROBE_ROUNDS + 1):
            if failure is None:
                failure = self.attempt(pending) if pending.size else None
                if failure is None:
                    break
            probe = probes.from_error(self.stage, failure) if round_ < _PROBE_ROUNDS else None
            found = probes.find(self.stage, [probe], self.records.parts(pending)) if probe else {}
            if not found:
                self.search(pending.tolist(), failure=failure)
                break
            if probe not in self.memory.idle:
                learned.add(probe)
            self.memory.remember(probe)
            suspects.update(found)
            pending = np.setdiff1d(pending, np.fromiter(found, np.int64, len(found)))
            failure = None
        self._settle(suspects, learned)

    def _settle(self, suspects: dict[int, Probe], learned: set[Probe]) -> None:
        """Reject what a trusted probe flagged; run each record an untrusted one flagged alone."""
        by_probe: dict[Probe, list[int]] = {}
        for number, probe in sorted(suspects.items()):
            by_probe.setdefault(probe, []).append(number)
        for probe, numbers in by_probe.items():
            # A probe's first finds run as one part, which must fail: if the stage takes them, the probe
            # misread the query (what runs or is skipped per record) and from now on only narrows the search.
            if probe.trusted and probe in learned and self.attempt(numbers) is None:
                self.memory.distrust(probe)
            elif probe.trusted:
                self.rejected.extend(self._rejected(n, probe.error) for n in numbers)
            else:
                self.search(numbers, len(numbers))

    def search(self, numbers: list[int], expected: int = 1, failure: Exception | None = None) -> None:
        """Group testing (Hwang's generalized binary splitting): test a group sized so that it is clean as
        often as not; a clean group is processed at once, a failing one is halved down to a record to blame
        while its clean halves are processed. ~log2(n/d) + 2 runs per bad record, where halving the whole
        batch costs ~2 log2(n). The number of bad records `d` is estimated from those met so far (`expected`
        before any): a batch of only bad records is soon tested record by record. `failure`: what running all
        of `numbers` raised, if known."""
        pool, bad, good = list(numbers), 0, 0
        while pool:
            d = expected if bad + good == 0 else max(1, round(bad / (bad + good) * len(pool)))
            size = 1 if len(pool) <= 2 * d - 2 else 2 ** int(math.log2((len(pool) - d + 1) / d))
            group, pool = pool[:size], pool[size:]
            failing = failure if failure is not None and not pool else self.attempt(group)
            failure = None
            while failing is not None and len(group) > 1:
                half, rest = group[: len(group) // 2], group[len(group) // 2 :]
                error = self.attempt(half)
                if error is None:  # the record to blame is in the rest
                    good += len(half)
                    group = rest
                    failing = self.attempt(rest) if len(rest) == 1 else failing
                else:
                    pool = rest + pool
                    group, failing = half, error
            if failing is None:
                good += len(group)
            else:
                bad += 1
                self.rejected.append(self._rejected(group[0], describe(failing)))

    def attempt(self, numbers) -> Exception | None:
        """Run the stage on these records, keeping its output; what it raised if it failed."""
        part = self.records.batch(np.asarray(numbers, np.int64))
        try:
            output, _ = self.stage.process(part, MIN_WATERMARK)  # MIN: the watermark stays where it was
        except Exception as exc:  # see process()
            if probes.outage(exc):
                raise
            return exc
        if output is not None:
            self.outputs.append(output)
        return None

    def _rejected(self, number: int, error: str) -> Rejected:
        upstream, record = self.records.record(number)
        return Rejected(upstream, record, error[:_ERROR_CHARS])


class _Records:
    """A batch's records numbered in upstream order, and any of them as a batch of their own."""

    def __init__(self, batch: InputBatch) -> None:
        self.tables = {u: batch.table(u) for u in batch.tables if batch.tables[u]}
        self.starts, start = {}, 0
        for upstream, table in self.tables.items():
            self.starts[upstream] = start
            start += table.num_rows
        self.all = np.arange(start, dtype=np.int64)

    def parts(self, numbers: np.ndarray) -> dict[str, tuple[pa.Table, np.ndarray]]:
        """Per upstream, its records among `numbers` (in order) and their numbers."""
        out = {}
        for upstream, table in self.tables.items():
            start = self.starts[upstream]
            mine = numbers[(numbers >= start) & (numbers < start + table.num_rows)]
            if mine.size:
                out[upstream] = (table.take(mine - start), mine)
        return out

    def batch(self, numbers: np.ndarray) -> InputBatch:
        """These records without the batch's watermarks."""
        parts = self.parts(numbers)
        return InputBatch(tables={u: [t] for u, (t, _) in parts.items()}, records=int(numbers.size))

    def record(self, number: int) -> tuple[str, dict]:
        upstream = next(u for u, t in self.tables.items() if number < self.starts[u] + t.num_rows)
        return upstream, self.tables[upstream].slice(number - self.starts[upstream], 1).to_pylist()[0]


def _unplannable(stage, exc: Exception) -> bool:
    """Spark refused the stage's own query before reading a record: every part of the batch would fail alike
    (a user function's stage is left to the search: its plan may depend on the data)."""
    spec = getattr(stage, "spec", None)
    return isinstance(exc, AnalysisException) and getattr(spec, "type", None) in ("sql", "window_aggregate")


def describe(exc: BaseException) -> str:
    # A Python UDF's error arrives with the Python worker's traceback: its last line names the error.
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[-1].strip() if lines and "Traceback" in str(exc) else " ".join(lines)
    return f"{type(exc).__name__}: {text}"[:_ERROR_CHARS]
