"""What the autoscaler needs to know of a job's dataflow, taken from its plan."""

from __future__ import annotations

from dataclasses import dataclass

from streamjobs_core.plan import JobPlan


@dataclass(frozen=True)
class OperatorInfo:
    name: str
    inputs: tuple[str, ...]
    consumers: int  # an upstream writes each record once per consumer: records_out counts every copy
    key_groups: int  # parallelism that divides this spreads key groups (or source partitions) evenly
    is_source: bool


@dataclass(frozen=True)
class Topology:
    operators: tuple[OperatorInfo, ...]  # in topological order

    @classmethod
    def of(cls, plan: JobPlan) -> Topology:
        spec = plan.spec
        sources = {s.name for s in spec.sources}
        return cls(tuple(
            OperatorInfo(
                name, tuple(getattr(spec.operator(name), "inputs", ())), len(spec.consumers(name)),
                plan.key_groups(name), name in sources,
            )
            for name in spec.topological_order()
        ))

    def __getitem__(self, name: str) -> OperatorInfo:
        for info in self.operators:
            if info.name == name:
                return info
        raise KeyError(name)
