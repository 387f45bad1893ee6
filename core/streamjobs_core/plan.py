"""The deployed form of a job: its spec, start time and the graph facts workers need."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cached_property

from .chaining import Chain, chains
from .control import ControlEvent
from .keygroups import Assignment
from .layout import JobKeys, job_id, namespace_of
from .spec import StreamJob

SPARK_OPERATOR_TYPES = ("sql", "pyspark", "window_aggregate", "stateful", "over", "lookup", "join")


@dataclass(frozen=True)
class Edge:
    upstream: str
    downstream: str
    key_by: tuple[str, ...] | None  # the downstream's routing columns for this input; None spreads records evenly


def routing_key(operator, upstream: str) -> tuple[str, ...] | None:
    """The columns by which `operator` wants its input from `upstream` partitioned: a join names them per
    input (its `on`), a keyed stage once for all (`keyBy`)."""
    per_input = getattr(operator, "routing_key", None)
    if per_input is not None:
        return per_input(upstream)
    key_by = getattr(operator, "key_by", None)
    return (key_by,) if key_by else None


@dataclass(frozen=True)
class JobPlan:
    job: StreamJob
    t0_ms: int  # event-time origin of the generator sources
    version: int = 0  # raised by every live reconfiguration (reconfigure.py); the deploy is version 0
    control: ControlEvent | None = None  # the control event this version carries to its operator's instances
    resets: tuple[str, ...] = ()  # stateful stages whose state this version starts afresh (--reset-state)
    # Generator sources whose partitions a re-split kept (resplit.py): no longer maxParallelism's, as the
    # offsets they committed are per partition.
    kept_partitions: tuple[tuple[str, int], ...] = ()

    @property
    def name(self) -> str:
        return self.job.metadata.name

    @property
    def id(self) -> str:
        """Which job's keys this plan runs on (layout.job_id)."""
        return job_id(self.job.metadata.namespace, self.name)

    @property
    def spec(self):
        return self.job.spec

    @property
    def keys(self) -> JobKeys:
        return JobKeys(self.id)

    def placed(self, job: str) -> JobPlan:
        """This plan as the plan of job `job`: a savepoint's plan restored under another namespace names it."""
        if job == self.id:
            return self
        _, _, name = job.rpartition("/")
        metadata = self.job.metadata.model_copy(update={"name": name, "namespace": namespace_of(job)})
        return replace(self, job=self.job.model_copy(update={"metadata": metadata}))

    @cached_property
    def chains(self) -> tuple[Chain, ...]:
        """The deployed units: operators chained into one worker (chaining.py), heads in topological order."""
        return chains(self.spec)

    @property
    def vertices(self) -> tuple[str, ...]:
        """The chain heads: what is deployed, assigned key groups and rescaled."""
        return tuple(chain.head for chain in self.chains)

    def chain(self, op: str) -> Chain:
        for chain in self.chains:
            if op in chain.operators:
                return chain
        raise KeyError(op)

    def head(self, op: str) -> str:
        """The operator whose workers run `op`."""
        return self.chain(op).head

    def runs_spark(self, op: str) -> bool:
        """Whether the workers of `op`'s chain start a SparkSession (seconds of warm-up before their first batch)."""
        return any(self.spec.operator(member).type in SPARK_OPERATOR_TYPES for member in self.chain(op).operators)

    def key_groups(self, op: str) -> int:
        """Units of ownership of an operator: source partitions for sources, else maxParallelism; a chained
        operator has its head's."""
        operator = self.spec.operator(self.head(op))
        if operator in self.spec.sources:
            kept = dict(self.kept_partitions).get(operator.name)
            return kept or getattr(operator, "partitions", None) or self.spec.max_parallelism
        return self.spec.max_parallelism

    def edges_in(self, op: str) -> tuple[Edge, ...]:
        operator = self.spec.operator(op)
        return tuple(Edge(up, op, routing_key(operator, up)) for up in getattr(operator, "inputs", ()))

    def edges_out(self, op: str) -> tuple[Edge, ...]:
        return tuple(Edge(op, c.name, routing_key(c, op)) for c in self.spec.consumers(op))

    def initial_assignment(self, op: str) -> Assignment:
        return Assignment.ranges(self.spec.operator(self.head(op)).parallelism, self.key_groups(op))

    def to_json(self) -> str:
        return json.dumps({"job": self.job.model_dump(mode="json", by_alias=True), "t0_ms": self.t0_ms,
                           "version": self.version,
                           "control": None if self.control is None else json.loads(self.control.encode()),
                           "resets": list(self.resets), "kept_partitions": dict(self.kept_partitions)})

    @classmethod
    def from_json(cls, text: str | bytes) -> JobPlan:
        data = json.loads(text)
        control = data.get("control")
        return cls(StreamJob.model_validate(data["job"]), int(data["t0_ms"]), int(data.get("version", 0)),
                   None if control is None else ControlEvent.decode(json.dumps(control)),
                   tuple(data.get("resets", ())), tuple(data.get("kept_partitions", {}).items()))


def edge_totals(exchange, keys: JobKeys, edges) -> list[tuple[int, int]]:
    """(records produced into, records consumed from) each edge, summed over its key groups, read from
    the exchange's counts (`Exchange.hashes`)."""
    names = [key for edge in edges for key in (keys.produced(edge.upstream, edge.downstream),
                                                keys.consumed(edge.upstream, edge.downstream))]
    totals = [sum(int(v) for v in counts.values()) for counts in exchange.hashes(names)]
    return list(zip(totals[::2], totals[1::2]))
