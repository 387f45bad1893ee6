"""A worker that keeps dying at the same input: its entries isolated, the one it dies at dead-lettered.

Whatever kills a worker in the middle of a batch (a native crash in a library, a user function that exits,
memory exhausted by one huge record) comes back when the restarted worker reads the same entries again:
without help it would die there forever, and the input behind would never arrive. So every start counts
itself at its input position (the committed offsets, `control.Attempt`): a start at the same position as the
last one means the last one died before committing anything. From the second such start on, the entries
its first batch reads are noted (the span). After `restarts.quarantineAfter` starts in a row, the worker
reads the span one entry at a time, naming each in the store before it processes it; a start that finds
the named entry still unprocessed twice knows which entry kills it, and commits it as a dead letter (kind
`quarantined`, with the cause the dying worker could give) with its offset past it. Then it goes on in
batches. Only entries of streams can be isolated (a source of external input, the streams between
operators); a generator source's records cannot.

Past `restarts.maxAttempts` starts in a row at one position the job fails, naming the operator, the cause
and the position: what kills the worker is not an entry (it dies before reading one, or reads no stream
that can be isolated, as a generator source).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import replace

from streamjobs_core.control import Attempt, JobFailure
from streamjobs_core.exchange import entry_order
from streamjobs_core.jobstore import JobStore
from streamjobs_core.spec import RestartSettings

log = logging.getLogger(__name__)

_SUSPECT_DEATHS = 2  # an entry processed alone is blamed once it killed the worker this often
_WHERE_SHOWN = 3  # streams named in a readable position


class Exhausted(RuntimeError):
    """The worker started too often in a row at one input position: the job fails."""

    def __init__(self, failure: JobFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class Quarantine:
    def __init__(self, jobs: JobStore, op: str, instance: int, settings: RestartSettings, isolates: bool) -> None:
        self._jobs = jobs
        self._op = op
        self._instance = instance
        self._settings = settings
        self._isolates = isolates  # whether the input can be read an entry at a time (stream entries)
        self._attempt: Attempt | None = None
        self._noting = False  # the first batch of a start at a position a worker died at before: note its span
        self.isolating = False
        self.cause = ""  # why the last start at this position ended, as the dying worker said

    def started(self, positions: dict[str, bytes]) -> tuple[str, str] | None:
        """Count this start at the input position restored; the entry to quarantine now, if one is to blame.
        Raises Exhausted past restarts.maxAttempts."""
        position, where = _digest(positions), _where(positions)
        last = self._jobs.attempt(self._op, self._instance)
        same = last is not None and not last.committed and last.position == position
        starts = last.starts + 1 if same else 1
        self.cause = last.cause if same else ""
        if starts > self._settings.max_attempts:
            raise Exhausted(JobFailure(self._op, self._instance, f"died {starts - 1} times in a row before committing "
                                       f"anything: {self.cause or 'no error was written (killed, or a native crash)'}",
                                       where))
        suspect = last.suspect if same else None
        self._attempt = Attempt(position, where, starts, os.getpid(), False, last.span if same else (), suspect,
                                last.suspect_deaths + 1 if suspect is not None else 0)
        self._jobs.save_attempt(self._op, self._instance, self._attempt)
        self._noting = self._isolates and starts >= 2
        self.isolating = self._isolates and starts > self._settings.quarantine_after and bool(self._attempt.span)
        if starts > 1:
            log.warning("%s/%d starts again at the input where it last died (%d in a row, at %s)%s", self._op,
                        self._instance, starts - 1, where, ": isolating its entries" if self.isolating else "")
        if suspect is not None and self._attempt.suspect_deaths >= _SUSPECT_DEATHS:
            return suspect
        return None

    def reading(self, positions: dict[str, bytes], before: dict[str, bytes]) -> None:
        """A batch read up to `positions` (from `before`) is about to be processed: where a worker died at this
        position, the entries it reads are noted as where to isolate."""
        if not self._noting or self._attempt is None:
            return
        self._noting = False
        span = dict(self._attempt.span)
        for stream, cursor in positions.items():
            if cursor != before.get(stream) and (stream not in span or entry_order(cursor) > entry_order(span[stream])):
                span[stream] = _text(cursor)
        self._save(span=tuple(sorted(span.items())))

    @property
    def watching(self) -> bool:
        """Whether the worker's reads matter here (a first batch to note, or entries to isolate)."""
        return self._noting or self.isolating

    def read_nothing(self, stream: str) -> None:
        """Isolating, the stream had no entry left to read (its noted ones were trimmed): done with it."""
        self._save(span=tuple(s for s in self._attempt.span if s[0] != stream))

    def next_stream(self, positions: dict[str, bytes]) -> str | None:
        """Isolating: a stream whose noted entries are not all processed yet; None ends the isolation."""
        for stream, last in self._attempt.span if self._attempt is not None else ():
            cursor = positions.get(stream)
            if cursor is not None and entry_order(cursor) < entry_order(last):
                return stream
        self.isolating = False
        self._save(committed=True, span=(), suspect=None, suspect_deaths=0)
        log.info("%s/%d processed the entries it had died at one by one: back to batches", self._op, self._instance)
        return None

    def processing(self, stream: str, entry_id: bytes, before: dict[str, bytes]) -> None:
        """Isolating: this entry is processed alone next (named first, so that a death blames it); `before`:
        the committed position it is read from, which a start after a death finds again."""
        suspect = (stream, _text(entry_id))
        deaths = self._attempt.suspect_deaths if self._attempt.suspect == suspect else 0
        self._save(position=_digest(before), where=_where(before), suspect=suspect, suspect_deaths=deaths)

    def committed(self) -> None:
        """A batch of this start committed: a start after it counts from one (once a start; not while isolating,
        whose record says which entry is processed)."""
        if self._attempt is not None and not self._attempt.committed and not self.isolating:
            self._noting = False
            self._save(committed=True)

    def quarantined(self) -> None:
        """The suspect went to the dead letters with its offset: the entry at fault is found, batches go on (were
        another entry of the span at fault too, it would be found the same way)."""
        self.isolating = self._noting = False
        self._save(committed=True, span=(), suspect=None, suspect_deaths=0)

    def died(self, exc: BaseException) -> None:
        """What the worker can say of its death, for the next start (and a dead letter)."""
        if self._attempt is not None:
            lines = str(exc).strip().splitlines()
            self._save(cause=f"{type(exc).__name__}: {lines[-1][:1000] if lines else ''}")

    def stopped(self) -> None:
        """A clean stop: a start after it counts from one."""
        self._jobs.save_attempt(self._op, self._instance, None)

    def _save(self, **changes) -> None:
        self._attempt = replace(self._attempt, **changes)
        self._jobs.save_attempt(self._op, self._instance, self._attempt)


def _digest(positions: dict[str, bytes]) -> str:
    return hashlib.sha1(repr(sorted(positions.items())).encode()).hexdigest()


def _where(positions: dict[str, bytes]) -> str:
    shown = ", ".join(f"{stream} @ {_text(cursor)}" for stream, cursor in sorted(positions.items())[:_WHERE_SHOWN])
    more = len(positions) - _WHERE_SHOWN
    return shown + (f" (and {more} more streams)" if more > 0 else "")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
