"""Watermarks: their bounds, and the run-length form in which a stream's per-upstream watermarks travel.

Every kg-stream entry carries its producer's watermark for the producer's key
groups; a consumer keeps one watermark per upstream key group and commits them
per stream as runs of equal values (a rescale of the upstream changes who sends
which, never how many there are).
"""

from __future__ import annotations

import msgpack
import numpy as np

MIN_WATERMARK = -(2**63)  # nothing is known yet
MAX_WATERMARK = 2**63 - 1  # the end of the input: every window fires

Runs = list[tuple[int, int, int]]  # (first upstream key group, last, watermark)


def runs_of(values: np.ndarray) -> Runs:
    """Runs of equal values as (first index, last index, value)."""
    if not len(values):
        return []
    starts = np.concatenate(([0], np.flatnonzero(np.diff(values)) + 1))
    ends = np.concatenate((starts[1:], [len(values)])) - 1
    return list(zip(starts.tolist(), ends.tolist(), values[starts].tolist()))


def encode_runs(runs: Runs) -> bytes:
    return msgpack.packb(runs)


def decode_runs(packed: bytes) -> Runs:
    return [tuple(run) for run in msgpack.unpackb(packed)]
