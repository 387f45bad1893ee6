"""Guard rails between a policy's recommendation and a rescale (Turbine, Flink's autoscaler).

Each rail is a pure function of one operator's decision and what the
autoscaler remembers of that operator; it returns the decision unchanged or
with the rule that held it back, so every blocked change says why, and a rail
that remembers returns what to remember next instead of changing its input.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from streamjobs_core.spec import AutoscalerSettings

from .decision import OperatorDecision, Rule
from .evaluate import Rates


def caught_up(d: OperatorDecision, rate: Rates, settings: AutoscalerSettings) -> OperatorDecision:
    """An operator scaled out for a catch-up goes back to what its steady rate needs once its backlog is
    down to an interval's input: the scale-back planned with the catch-up, not a new scale-down to wait for."""
    if d.steady_parallelism is None or d.steady_parallelism >= d.current or d.parallelism > d.current:
        return d
    if rate.backlog > max(rate.input_per_s, 1.0) * settings.interval_s:
        return d
    return replace(d, parallelism=d.steady_parallelism, rule=Rule.CATCH_UP_DONE,
                   note=_and(d.note, f"backlog {rate.backlog:,.0f}, under an interval's input"))


def max_step(d: OperatorDecision, settings: AutoscalerSettings) -> OperatorDecision:
    highest = math.ceil(d.current * settings.max_scale_factor)
    lowest = max(1, math.ceil(d.current / settings.max_scale_factor))
    factor = _and(d.note, f"limited by maxScaleFactor {settings.max_scale_factor:g}")
    if d.parallelism > highest:
        return replace(d, parallelism=highest, rule=Rule.MAX_SCALE_FACTOR, note=factor)
    if d.parallelism < lowest:
        return replace(d, parallelism=lowest, rule=Rule.MAX_SCALE_FACTOR, note=factor)
    return d


def activation(d: OperatorDecision, streak: int, settings: AutoscalerSettings,
               settled: bool = True) -> tuple[OperatorDecision, int]:
    """Scale up only when `activationIntervals` consecutive intervals asked for it; act on the latest; one
    interval more when the true rate is not `settled` (evaluate.Rates): a fit on batch sizes too alike.
    `streak`: the intervals in a row that asked before this one; returns the decision and the streak now."""
    if d.parallelism <= d.current:
        return d, 0
    streak += 1
    needed = settings.activation_intervals + (0 if settled else 1)
    if streak < needed:
        why = f"asked {streak} of {needed} intervals"
        if not settled:
            why += " (the true rate rests on batch sizes too alike to outweigh contention)"
        return replace(d, parallelism=d.current, rule=Rule.ACTIVATION, note=_and(d.note, why)), streak
    return d, 0


def ineffective(d: OperatorDecision, blocked: str | None) -> OperatorDecision:
    """`blocked`: why scaling this operator up did not help before, if it did not."""
    if d.parallelism > d.current and blocked:
        return replace(d, parallelism=d.current, rule=Rule.INEFFECTIVE, note=blocked)
    return d


class DownAsk(NamedTuple):
    """A scale-down asked for: since when, the largest recommendation of the delay, and the largest of those
    whose metrics window lies wholly after `since` (None until one does)."""

    since: float
    largest: int
    settled: int | None


def scale_down_delay(
    d: OperatorDecision, now: float, asked: DownAsk | None, settings: AutoscalerSettings
) -> tuple[OperatorDecision, DownAsk | None]:
    """Scale down only after `scaleDownDelayS` of asking for it, to the largest recommendation of that time.
    A window that began before the first ask still holds the load that fell since: once a recommendation from a
    window wholly after it is there, only those count. Returns the decision and what to remember now."""
    if d.parallelism >= d.current:
        return d, None
    asked = asked or DownAsk(now, d.parallelism, None)
    settled = asked.settled
    if now - settings.metrics_window_s >= asked.since:
        settled = max(settled or d.parallelism, d.parallelism)
    asked = DownAsk(asked.since, max(asked.largest, d.parallelism), settled)
    largest = asked.largest if settled is None else settled
    waited = now - asked.since
    if waited < settings.scale_down_delay_s:
        return replace(d, parallelism=d.current, rule=Rule.SCALE_DOWN_DELAY,
                       note=f"{settings.scale_down_delay_s - waited:.0f} s left; largest recommendation {largest}"), (
            asked)
    return replace(d, parallelism=largest, note=_and(d.note, f"largest recommendation over the delay: {largest}")), None


def undone_by_history(
    d: OperatorDecision, now: float, history: list[dict], settings: AutoscalerSettings
) -> OperatorDecision:
    """Skip a scale-down to a parallelism that a scale-up left within the horizon: it would come back."""
    horizon = settings.scale_down_history_horizon_s
    if not horizon or d.parallelism >= d.current:
        return d
    for entry in reversed(history):
        if now - entry["time"] > horizon:
            break
        for past in entry["operators"]:
            if (past["operator"] == d.operator and entry.get("executed")
                    and past["current"] <= d.parallelism < past["parallelism"]):
                return replace(d, parallelism=d.current, rule=Rule.HISTORY_VETO,
                               note=f"a scale-up from {past['current']} {now - entry['time']:.0f} s ago")
    return d


def _and(note: str, more: str) -> str:
    return f"{note}; {more}" if note else more
