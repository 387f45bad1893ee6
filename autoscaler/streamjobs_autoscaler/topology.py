"""What the autoscaler needs to know of a job's dataflow, taken from its plan.

The autoscaler sizes what is deployed: chains of operators (core's chaining.py),
each named by its head. A chain's input is its head's, its output its tail's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from streamjobs_core.plan import JobPlan

from .collect import Snapshot


@dataclass(frozen=True)
class OperatorInfo:
    name: str  # a chain's head: what is deployed and rescaled
    inputs: tuple[str, ...]  # the heads of the chains that feed it
    consumers: int  # an upstream writes each record once per consumer: records_out counts every copy
    key_groups: int  # what its instances share: key groups (or a source's partitions)
    is_source: bool
    output: str | None = None  # the chain's tail, whose output leaves it; None: the head itself


@dataclass(frozen=True)
class Topology:
    operators: tuple[OperatorInfo, ...]  # in topological order
    rescale_stops: bool = False  # the rescale strategy stops the job (restart): nothing is processed meanwhile

    @classmethod
    def of(cls, plan: JobPlan) -> Topology:
        spec = plan.spec
        sources = {s.name for s in spec.sources}
        infos = []
        for chain in plan.chains:
            inputs = tuple(plan.head(u) for u in getattr(spec.operator(chain.head), "inputs", ()))
            infos.append(OperatorInfo(
                chain.head, inputs, len(spec.consumers(chain.tail)), plan.key_groups(chain.head),
                chain.head in sources, chain.tail if chain.tail != chain.head else None,
            ))
        return cls(tuple(infos), spec.rescale.strategy == "restart")

    def fold(self, snapshot: Snapshot) -> Snapshot:
        """Per chain: its head's counters (input, busy time, lag: the chain's worker) with its tail's output."""
        operators = dict(snapshot.operators)
        for info in self.operators:
            head, tail = operators.get(info.name), operators.get(info.output or "")
            if info.output is not None and head is not None and tail is not None:
                operators[info.name] = dataclasses.replace(head, records_out=tail.records_out)
        return Snapshot(snapshot.time, operators)

    def __getitem__(self, name: str) -> OperatorInfo:
        for info in self.operators:
            if info.name == name:
                return info
        raise KeyError(name)
