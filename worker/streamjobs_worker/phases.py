"""Where a micro-batch's time goes, phase by phase: `streamjobs bench hop` records it.

The worker and its stages mark their phases; nothing is recorded unless a
`Recording` is active (a worker runs one batch at a time, in one thread), so
the marks cost a function call each on the hot path.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

# In the order a batch meets them.
PHASES = ("read", "decode", "to_jvm", "plan", "execute", "state", "encode", "commit")

_active: Recording | None = None


class Recording:
    """Seconds per phase while active; a phase nested in another is counted in both."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def __enter__(self) -> Recording:
        global _active
        _active = self
        return self

    def __exit__(self, *_) -> None:
        global _active
        _active = None


def active() -> bool:
    return _active is not None


@contextmanager
def phase(name: str) -> Iterator[None]:
    recording = _active
    if recording is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        recording.seconds[name] += time.perf_counter() - started
