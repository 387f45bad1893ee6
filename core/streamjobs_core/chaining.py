"""Operator chaining: consecutive operators on a forward edge run in one worker.

As in Flink, an operator joins the chain of the operator before it when the
edge between them is forward: the upstream has no other consumer, the
downstream no other input and no keyBy (no repartitioning), both have the same
parallelism, and neither says `chain: false`. A chain has no Redis hop and no
second micro-batch inside it: the head's batch flows through every member and
only the tail's output goes to Redis.

A chain is deployed, rescaled, assigned key groups and handed over as one: its
head's. Metrics, the report and the live view still show every operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .spec import STATEFUL_TYPES


@dataclass(frozen=True)
class Chain:
    operators: tuple[str, ...]  # head first, in data-flow order

    @property
    def head(self) -> str:
        return self.operators[0]

    @property
    def tail(self) -> str:
        return self.operators[-1]


def forward(spec: Any, upstream: str, downstream: str) -> bool:
    """Whether `downstream` may run in the same worker as `upstream`, right after it."""
    up, down = spec.operator(upstream), spec.operator(downstream)
    if down in spec.sources or not (up.chain and down.chain):
        return False
    if getattr(down, "key_by", None) is not None or down.type in STATEFUL_TYPES:
        return False  # a keyed edge repartitions by key: not forward
    return (
        down.inputs == (upstream,)
        and len(spec.consumers(upstream)) == 1
        and up.parallelism == down.parallelism
    )


def chains(spec: Any) -> tuple[Chain, ...]:
    """The job's chains, heads in topological order."""
    members: dict[str, list[str]] = {}
    head_of: dict[str, str] = {}
    for name in spec.topological_order():
        op = spec.operator(name)
        inputs = getattr(op, "inputs", ())
        if len(inputs) == 1 and forward(spec, inputs[0], name):
            head = head_of[inputs[0]]
            members[head].append(name)
        else:
            head = name
            members[head] = [name]
        head_of[name] = head
    return tuple(Chain(tuple(ops)) for ops in members.values())
