"""Guard rails between a policy's recommendation and a rescale (Turbine, Flink's autoscaler).

Each rail is a small function of one operator's decision and what the
autoscaler remembers; it returns the decision unchanged or with the rule that
held it back, so every blocked change says why.
"""

from __future__ import annotations

import math
from dataclasses import replace

from streamjobs_core.spec import AutoscalerSettings

from .decision import OperatorDecision


def max_step(d: OperatorDecision, settings: AutoscalerSettings) -> OperatorDecision:
    highest = math.ceil(d.current * settings.max_scale_factor)
    lowest = max(1, math.ceil(d.current / settings.max_scale_factor))
    if d.parallelism > highest:
        return replace(d, parallelism=highest, rule=f"max scale factor {settings.max_scale_factor:g}")
    if d.parallelism < lowest:
        return replace(d, parallelism=lowest, rule=f"max scale factor {settings.max_scale_factor:g}")
    return d


def activation(d: OperatorDecision, streak: dict[str, int], settings: AutoscalerSettings) -> OperatorDecision:
    """Scale up only when `activationIntervals` consecutive intervals asked for it; act on the latest."""
    if d.parallelism <= d.current:
        streak.pop(d.operator, None)
        return d
    streak[d.operator] = streak.get(d.operator, 0) + 1
    if streak[d.operator] < settings.activation_intervals:
        return replace(d, parallelism=d.current, rule="activation",
                       note=f"{d.note}; asked {streak[d.operator]} of {settings.activation_intervals} intervals")
    streak.pop(d.operator)
    return d


def ineffective(d: OperatorDecision, blocked: dict[str, str]) -> OperatorDecision:
    if d.parallelism > d.current and d.operator in blocked:
        return replace(d, parallelism=d.current, rule="ineffective scaling", note=blocked[d.operator])
    return d


def scale_down_delay(
    d: OperatorDecision, now: float, seen: dict[str, tuple[float, int]], settings: AutoscalerSettings
) -> OperatorDecision:
    """Scale down only after `scaleDownDelayS` of asking for it, to the largest recommendation of that time."""
    if d.parallelism >= d.current:
        seen.pop(d.operator, None)
        return d
    since, largest = seen.get(d.operator, (now, d.parallelism))
    largest = max(largest, d.parallelism)
    seen[d.operator] = (since, largest)
    waited = now - since
    if waited < settings.scale_down_delay_s:
        return replace(d, parallelism=d.current, rule="scale-down delay",
                       note=f"{settings.scale_down_delay_s - waited:.0f} s left; largest recommendation {largest}")
    seen.pop(d.operator, None)
    return replace(d, parallelism=largest, note=f"{d.note}; largest recommendation over the delay: {largest}")


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
                return replace(d, parallelism=d.current, rule="history veto",
                               note=f"a scale-up from {past['current']} {now - entry['time']:.0f} s ago")
    return d
