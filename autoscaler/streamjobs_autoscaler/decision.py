"""Decisions and their explanations: what changed, the numbers behind it, the rule that fired or blocked."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum


class Rule(StrEnum):
    """The rule that set an operator's parallelism: a policy's, or a guard rail's that changed or held it."""

    DS2 = "ds2"
    DS2_NO_BUSY_TIME = "ds2: no busy time in the window, kept"
    DS2_IN_BAND = "ds2: within the utilization band"
    CATCH_UP_DONE = "ds2: backlog caught up, back to the steady parallelism"
    REACTIVE_UP = "reactive: backlog per instance over lagHighRecords"
    REACTIVE_DOWN = "reactive: backlog per instance under lagLowRecords, idle"
    REACTIVE_HOLD = "reactive: within thresholds"
    MAX_SCALE_FACTOR = "max scale factor"
    ACTIVATION = "activation"
    INEFFECTIVE = "ineffective scaling"
    SCALE_DOWN_DELAY = "scale-down delay"
    HISTORY_VETO = "history veto"

    @property
    def event(self) -> str | None:
        """The Event reason of a guard rail that holds a change back (an Event each); None for the rest,
        whose holds only wait."""
        return _HOLDING_EVENTS.get(self)


_HOLDING_EVENTS = {Rule.SCALE_DOWN_DELAY: "ScaleDownDelayed", Rule.INEFFECTIVE: "ScaleUpBlocked",
                   Rule.HISTORY_VETO: "ScaleDownVetoed"}


@dataclass(frozen=True)
class OperatorDecision:
    operator: str
    current: int
    recommended: int  # what the policy asked for, before guard rails
    parallelism: int  # what will run (== current when blocked or unchanged)
    rule: Rule  # the rule that set `parallelism`
    target_rate: float | None = None
    true_rate_per_instance: float | None = None
    batch_cost_s: float | None = None  # fixed busy time per batch, fitted out of the true rate
    input_rate: float | None = None
    utilization: float | None = None
    backlog: float | None = None
    steady_parallelism: int | None = None  # ds2: what the steady rate needs; less than `parallelism` while catching up
    note: str = ""

    @property
    def changes(self) -> bool:
        return self.parallelism != self.current

    def explain(self) -> str:
        numbers = []
        if self.target_rate is not None:
            numbers.append(f"target {self.target_rate:,.0f} rec/s")
        if self.true_rate_per_instance is not None:
            numbers.append(f"true rate {self.true_rate_per_instance:,.0f} rec/s per instance")
        if self.batch_cost_s:
            numbers.append(f"fixed {self.batch_cost_s * 1000:,.0f} ms per batch")
        if self.input_rate is not None:
            numbers.append(f"input {self.input_rate:,.0f} rec/s")
        if self.utilization is not None:
            numbers.append(f"busy {self.utilization:.0%}")
        if self.backlog is not None:
            numbers.append(f"backlog {self.backlog:,.0f}")
        head = f"{self.operator} {self.current} -> {self.parallelism}"
        if self.recommended != self.parallelism:
            head += f" (recommended {self.recommended})"
        note = f"; {self.note}" if self.note else ""
        return f"{head} [{self.rule}]: {', '.join(numbers)}{note}"


@dataclass(frozen=True)
class Decision:
    time: float  # the autoscaler clock's seconds
    policy: str
    operators: tuple[OperatorDecision, ...]
    executed: bool = False
    error: str | None = None

    @property
    def changes(self) -> tuple[OperatorDecision, ...]:
        return tuple(d for d in self.operators if d.changes)

    def to_dict(self) -> dict:
        shown = self.changes or self.operators
        return {**asdict(self), "operators": [asdict(d) | {"why": d.explain()} for d in self.operators],
                "summary": "; ".join(d.explain() for d in shown)}
