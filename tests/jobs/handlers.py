"""Control-event handlers of the test jobs (spec.controlHandlers names them as tests.jobs.handlers:NAME)."""

from __future__ import annotations


def echo(context) -> dict:
    """What the instance was asked and what it owns at the sync point."""
    return {"args": dict(context.args), "key_groups": list(context.key_groups), "version": context.version,
            "records": sum(context.records.values())}


def fail(context) -> dict:
    raise ValueError(f"asked to fail on instance {context.instance}")
