"""The control plane's records: what the rescale controller, the fleets, the workers and the tools tell each
other through the job store (the jobstore package).

Each record is a frozen value with its wire encoding beside it, so a writer and
its readers cannot drift apart; which Redis key holds it is the store's
business alone.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from enum import StrEnum


class Strategy(StrEnum):
    """How a rescale moves key groups (see rescale.py)."""

    ALL_AT_ONCE = "all_at_once"
    FLUID = "fluid"
    BATCHED = "batched"
    RESTART = "restart"

    @property
    def stepwise(self) -> bool:
        """Key groups move a step at a time while every instance keeps running (Megaphone)."""
        return self in (Strategy.FLUID, Strategy.BATCHED)

    @classmethod
    def parse(cls, text: str) -> Strategy:
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown rescale strategy '{text}' (one of {', '.join(s.value for s in cls)})") from None


class Phase(StrEnum):
    PRESTAGE = "PRESTAGE"
    HANDOVER = "HANDOVER"
    RETIRE = "RETIRE"


@dataclass(frozen=True)
class RescaleState:
    """The rescale in progress, saved at every phase change so a restarted controller resumes it."""

    operator: str
    from_parallelism: int
    to_parallelism: int
    strategy: Strategy
    epoch: int
    phase: Phase
    started_at: float  # wall clock, for the status shown meanwhile
    released_at_commit: int = 0  # key groups of finished steps released at a commit, not at their markers
    moved_key_groups: int | None = None  # known once the new assignment is written
    steps: int | None = None
    owners: tuple[int, ...] | None = None  # the new owner of each key group, when chosen (a rebalance)

    def at(self, phase: Phase, **changes) -> RescaleState:
        return replace(self, phase=phase, **changes)

    def as_dict(self) -> dict:
        """The form `streamjobs status` and the StreamJob's status show."""
        return {"operator": self.operator, "from": self.from_parallelism, "to": self.to_parallelism,
                "strategy": self.strategy.value, "epoch": self.epoch, "phase": self.phase.value,
                "started_at": self.started_at, "released_at_commit": self.released_at_commit,
                "moved_key_groups": self.moved_key_groups, "steps": self.steps,
                "owners": None if self.owners is None else list(self.owners)}

    def encode(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def decode(cls, raw: str | bytes) -> RescaleState:
        d = json.loads(raw)
        return cls(d["operator"], int(d["from"]), int(d["to"]), Strategy(d["strategy"]), int(d["epoch"]),
                   Phase(d["phase"]), float(d["started_at"]), int(d.get("released_at_commit") or 0),
                   d.get("moved_key_groups"), d.get("steps"), _owners(d.get("owners")))


@dataclass(frozen=True)
class RescaleRecord:
    """A rescale that ended: what it did and what it cost (the history `streamjobs status` shows)."""

    operator: str
    from_parallelism: int
    to_parallelism: int
    strategy: Strategy
    epoch: int
    pause_ms: float  # the longest a key group waited (stepwise: the longest step)
    rescale_s: float | None = None  # None for one rolled back
    moved_key_groups: int | None = None
    steps: int | None = None
    released_at_commit: int = 0
    rolled_back: bool = False  # undone in PRESTAGE: the operator kept `from_parallelism`
    ended_at: float | None = None  # wall clock

    @classmethod
    def of(cls, state: RescaleState, pause_ms: float, rescale_s: float | None = None,
           rolled_back: bool = False) -> RescaleRecord:
        return cls(state.operator, state.from_parallelism, state.to_parallelism, state.strategy, state.epoch,
                   pause_ms, rescale_s, state.moved_key_groups, state.steps, state.released_at_commit, rolled_back,
                   round(time.time(), 3))

    @property
    def parallelism(self) -> int:
        """The operator's parallelism after it."""
        return self.from_parallelism if self.rolled_back else self.to_parallelism

    def as_dict(self) -> dict:
        """The form reports, events and the history hold."""
        d = {k: v for k, v in asdict(self).items() if k not in ("from_parallelism", "to_parallelism")}
        return {"operator": self.operator, "from": self.from_parallelism, "to": self.to_parallelism,
                **d, "strategy": self.strategy.value}

    def encode(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def decode(cls, raw: str | bytes) -> RescaleRecord:
        d = json.loads(raw)
        return cls(d["operator"], int(d["from"]), int(d["to"]), Strategy(d["strategy"]), int(d["epoch"]),
                   float(d["pause_ms"]), d.get("rescale_s"), d.get("moved_key_groups"), d.get("steps"),
                   int(d.get("released_at_commit") or 0), bool(d.get("rolled_back")), d.get("ended_at"))


@dataclass(frozen=True)
class RescaleRequest:
    """A rescale asked for from outside the runtime (`streamjobs rescale`, the chaos command)."""

    operator: str
    parallelism: int
    strategy: Strategy | None = None  # None: the spec's rescale.strategy
    owners: tuple[int, ...] | None = None  # chosen owners (a rebalance); None: the spec's assignment

    def encode(self) -> str:
        return json.dumps({"operator": self.operator, "parallelism": self.parallelism,
                           "strategy": self.strategy.value if self.strategy else None,
                           "owners": None if self.owners is None else list(self.owners)})

    @classmethod
    def decode(cls, raw: str | bytes) -> RescaleRequest:
        d = json.loads(raw)
        return cls(d["operator"], int(d["parallelism"]), Strategy(d["strategy"]) if d.get("strategy") else None,
                   _owners(d.get("owners")))


@dataclass(frozen=True)
class ReconfigureRequest:
    """A spec change asked for from outside the runtime (`streamjobs reconfigure`): the new StreamJob, and an
    id its record answers to."""

    job: str  # the StreamJob as JSON
    id: str
    reset: tuple[str, ...] = ()  # stateful stages whose state starts afresh (--reset-state)

    def encode(self) -> str:
        return json.dumps({"job": self.job, "id": self.id, "reset": list(self.reset)})

    @classmethod
    def decode(cls, raw: str | bytes) -> ReconfigureRequest:
        d = json.loads(raw)
        return cls(d["job"], d["id"], tuple(d.get("reset", ())))


@dataclass(frozen=True)
class ReconfigureState:
    """The live reconfiguration in progress: plan `version` published, its barriers on their way."""

    version: int
    started_at: float  # wall clock
    changes: tuple[str, ...]  # what changes live, as `reconfigure.Change.describe` says it
    request: str | None = None

    def encode(self) -> str:
        return json.dumps({"version": self.version, "started_at": self.started_at, "changes": list(self.changes),
                           "request": self.request})

    @classmethod
    def decode(cls, raw: str | bytes) -> ReconfigureState:
        d = json.loads(raw)
        return cls(int(d["version"]), float(d["started_at"]), tuple(d["changes"]), d.get("request"))


@dataclass(frozen=True)
class ReconfigureRecord:
    """A reconfiguration that ended: switched live to `version`, or refused (`refused` says why)."""

    version: int | None
    changes: tuple[str, ...]
    request: str | None = None
    duration_s: float | None = None  # from publishing the plan to the last key group's switch
    pause_ms: float | None = None  # the longest an instance held its input back to align its barriers
    aligned_ms: dict[str, float] | None = None  # per `<op>/<instance>`
    refused: str | None = None

    def as_dict(self) -> dict:
        return asdict(self) | {"changes": list(self.changes)}

    def encode(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def decode(cls, raw: str | bytes) -> ReconfigureRecord:
        d = json.loads(raw)
        return cls(d["version"], tuple(d["changes"]), d.get("request"), d.get("duration_s"), d.get("pause_ms"),
                   d.get("aligned_ms"), d.get("refused"))


@dataclass(frozen=True)
class ControlEvent:
    """A control event for every instance of `operator` (`streamjobs control`): delivered in-band, at the
    sync point of a plan version of its own, to the handler named `name` (controlhandlers.py)."""

    id: str
    operator: str
    name: str
    args: dict[str, str]

    def encode(self) -> str:
        return json.dumps({"id": self.id, "operator": self.operator, "name": self.name, "args": self.args})

    @classmethod
    def decode(cls, raw: str | bytes) -> ControlEvent:
        d = json.loads(raw)
        return cls(d["id"], d["operator"], d["name"], {str(k): str(v) for k, v in d["args"].items()})


@dataclass(frozen=True)
class ControlRecord:
    """A control event delivered: the plan version it travelled with, and per `<op>/<instance>` the handler's
    reply (or `{"error": ...}` where it raised); `refused` says why an event was not sent at all."""

    event: ControlEvent
    version: int | None
    replies: dict[str, object]
    duration_s: float | None = None
    pause_ms: float | None = None
    refused: str | None = None

    def as_dict(self) -> dict:
        return {"event": json.loads(self.event.encode()), "version": self.version, "replies": self.replies,
                "duration_s": self.duration_s, "pause_ms": self.pause_ms, "refused": self.refused}

    def encode(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def decode(cls, raw: str | bytes) -> ControlRecord:
        d = json.loads(raw)
        return cls(ControlEvent.decode(json.dumps(d["event"])), d["version"], d["replies"], d.get("duration_s"),
                   d.get("pause_ms"), d.get("refused"))


@dataclass(frozen=True)
class StandbyStatus:
    """One standby of an all_at_once rescale (worker --await-epoch): ready for an epoch once its Spark is up and
    the bulk of its state loaded; `lag`, the changelog entries its last catch-up round applied."""

    instance: int
    epoch: int | None  # None until ready
    lag: int | None = None  # None for an operator without state


@dataclass(frozen=True)
class Promotion:
    """What a warm spare becomes (spares.py)."""

    instance: int
    await_epoch: int | None = None  # a standby of this epoch (all_at_once), not a running instance

    def encode(self) -> str:
        return json.dumps({"instance": self.instance, "awaitEpoch": self.await_epoch})

    @classmethod
    def decode(cls, raw: str | bytes) -> Promotion:
        fields = json.loads(raw)
        return cls(int(fields["instance"]), fields.get("awaitEpoch"))


@dataclass(frozen=True)
class InstanceAddress:
    """A running instance's metrics endpoint; registered once its Spark is up, so it doubles as readiness."""

    operator: str
    instance: int
    address: str  # host:port

    @property
    def field(self) -> str:
        return f"{self.operator}/{self.instance}"

    @classmethod
    def decode(cls, field: str | bytes, address: str | bytes) -> InstanceAddress:
        op, _, instance = as_text(field).rpartition("/")
        return cls(op, int(instance), as_text(address))


@dataclass(frozen=True)
class PartitionProgress:
    """What a source committed for one partition: where to read on (a generator's next offset, an external
    stream's last entry id), how many records it took, and for an external stream the producer's position
    there and where it started."""

    cursor: int | bytes | None = None  # as committed: the reader knows its kind
    records: int | None = None
    position: int | None = None
    start: int | None = None

    _FIELDS = (("cursor", "p"), ("records", "n"), ("position", "e"), ("start", "s"))

    def fields(self, partition: int) -> dict[str, int | str]:
        return {f"{letter}{partition}": getattr(self, name) for name, letter in self._FIELDS
                if getattr(self, name) is not None}

    @classmethod
    def field_names(cls, partition: int) -> list[str]:
        return [f"{letter}{partition}" for _, letter in cls._FIELDS]

    @classmethod
    def decode(cls, values: list) -> PartitionProgress:
        """From the values of `field_names`, in order."""
        cursor, *counts = values
        return cls(cursor, *(int(v) if v is not None else None for v in counts))


@dataclass(frozen=True)
class Attempt:
    """An instance's starts at one input position (its committed offsets), kept so that a worker that keeps
    dying at the same input is noticed by the next start: after `restarts.quarantineAfter` such starts it
    processes the entries its dying batches read (`span`) one at a time, naming each (`suspect`) before it
    does; an entry it dies at alone, twice, is dead-lettered (quarantine.py)."""

    position: str  # digest of the committed offsets of every owned stream or partition
    where: str  # the same, readable (the first few), for an error message
    starts: int  # starts in a row at this position (this one included) that committed nothing
    pid: int  # the process of the start: a supervisor tells its own worker's record from an older one
    committed: bool = False  # this start committed a batch: the next one counts from one again
    span: tuple[tuple[str, str], ...] = ()  # per stream: the last entry a dying batch read
    suspect: tuple[str, str] | None = None  # (stream, entry ID) being processed alone
    suspect_deaths: int = 0  # starts that found the suspect still unprocessed
    cause: str = ""  # why the last start ended, where the worker could say (its exception)

    def encode(self) -> str:
        return json.dumps({"position": self.position, "where": self.where, "starts": self.starts, "pid": self.pid,
                           "committed": self.committed, "span": [list(s) for s in self.span],
                           "suspect": None if self.suspect is None else list(self.suspect),
                           "suspect_deaths": self.suspect_deaths, "cause": self.cause})

    @classmethod
    def decode(cls, raw: str | bytes) -> Attempt:
        d = json.loads(raw)
        suspect = d.get("suspect")
        return cls(d["position"], d.get("where", ""), int(d["starts"]), int(d.get("pid", 0)),
                   bool(d.get("committed")), tuple((s, e) for s, e in d.get("span", ())),
                   None if suspect is None else (suspect[0], suspect[1]), int(d.get("suspect_deaths", 0)),
                   d.get("cause", ""))


EXIT_FAILED = 3  # a worker's exit status once it recorded a JobFailure: restarting it would not help


@dataclass(frozen=True)
class JobFailure:
    """Why a job stopped for good: a worker's mistake no restart can mend (a query that does not plan, a
    function that does not import) or one that died at the same input past `restarts.maxAttempts`."""

    operator: str
    instance: int
    cause: str
    where: str = ""  # the input position it kept dying at, if that is what happened

    def describe(self) -> str:
        at = f" at input {self.where}" if self.where else ""
        return f"{self.operator}/{self.instance}{at}: {self.cause}"

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: str | bytes) -> JobFailure:
        d = json.loads(raw)
        return cls(d["operator"], int(d["instance"]), d["cause"], d.get("where", ""))


def _owners(listed: list | None) -> tuple[int, ...] | None:
    return None if listed is None else tuple(int(o) for o in listed)


def as_text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
