"""Control events at their sync point (Chi): the handler an instance runs for one, and its reply.

A control event (`streamjobs control`) travels as a plan version of its own,
the spec unchanged (reconfigure.py): each instance of its operator meets it at
its switch, after every record before the cut and before any after it, and
calls the handler the event names with a `ControlContext`, what the instance
holds at that point. The reply (JSON) is committed with the switch, so an
instance killed before its commit meets the barriers again after its restart
and replies then, once. A handler that raises replies `{"error": ...}`: a
control event never stops the job.

Built in (spec.BUILT_IN_HANDLERS): `load`, the records each owned key group
read so far (what the skew-aware rebalance measures, rebalance.py), and
`state`, the rows each owned key group holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from streamjobs_core.control import ControlEvent
from streamjobs_core.plan import JobPlan

from .stages.base import load_function
from .state import KeyGroupStore


@dataclass(frozen=True)
class ControlContext:
    """What a handler sees of one instance at the event's sync point."""

    operator: str
    instance: int
    version: int  # the plan version the event travels with
    args: Mapping[str, str]
    key_groups: tuple[int, ...]  # owned (a source's: its partitions)
    watermarks: Mapping[int, int]  # per owned key group, ms
    records: Mapping[int, int]  # per owned key group: records read from its streams, up to the sync point
    offsets: Mapping[int, str]  # a source's: per partition, where it stands at the cut
    _store: KeyGroupStore | None = field(default=None, repr=False)

    def state(self, kg: int) -> pa.Table | None:
        """The rows key group `kg` holds (a stateful stage's), as of the sync point."""
        return self._store.table(kg) if self._store is not None else None


def load(context: ControlContext) -> dict:
    if context.offsets:
        return {"offsets": {str(p): o for p, o in context.offsets.items()}}
    return {"records": {str(kg): n for kg, n in context.records.items()}}


def state(context: ControlContext) -> dict:
    rows = {}
    for kg in context.key_groups:
        table = context.state(kg)
        rows[str(kg)] = 0 if table is None else table.num_rows
    return {"rows": rows}


BUILT_IN: dict[str, Callable[[ControlContext], object]] = {"load": load, "state": state}


def reply(event: ControlEvent, plan: JobPlan, context: ControlContext) -> str:
    """The handler's answer as JSON; what it raised, if it did."""
    try:
        handler = BUILT_IN.get(event.name) or load_function(plan.spec.handlers[event.name])
        return json.dumps(handler(context), default=str)
    except Exception as exc:  # a user's handler: its failure is its reply, not the instance's end
        return json.dumps({"error": f"{type(exc).__name__}: {exc}"})
