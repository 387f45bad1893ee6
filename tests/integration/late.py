"""What an event-time stage met late: the records the chain dead-letters, with their reasons."""

from __future__ import annotations


def late_rows(stage) -> list[tuple[dict, str]]:
    """The records the stage met behind their key group's watermark since the last call, each with its reason."""
    found = [(row, reason) for late in stage.late for row, reason in zip(late.rows.to_pylist(), late.reasons)]
    stage.late.clear()
    return found
