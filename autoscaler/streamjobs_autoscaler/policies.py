"""Decide per operator: what each policy recommends, before the guard rails (guards.py)."""

from __future__ import annotations

from collections.abc import Callable

from streamjobs_core.spec import AutoscalerSettings

from .decision import OperatorDecision, Rule
from .evaluate import Rates, ds2, evenly_spread
from .topology import Topology

Policy = Callable[[Topology, dict[str, Rates], dict[str, int], AutoscalerSettings], list[OperatorDecision]]


def bounds(settings: AutoscalerSettings, key_groups: int) -> tuple[int, int]:
    highest = min(key_groups, settings.max_parallelism or key_groups)
    return min(settings.min_parallelism, highest), highest


def ds2_policy(
    topology: Topology, rates: dict[str, Rates], current: dict[str, int], settings: AutoscalerSettings
) -> list[OperatorDecision]:
    targets = ds2(topology, rates, settings)
    out = []
    for info in topology.operators:
        if info.name not in targets:
            continue
        target, rate, now = targets[info.name], rates[info.name], current[info.name]
        common = dict(target_rate=target.target_rate, true_rate_per_instance=target.true_rate_per_instance,
                      batch_cost_s=rate.batch_cost_s,
                      input_rate=rate.input_per_s, utilization=rate.busy_ratio, backlog=rate.backlog)
        if target.parallelism is None:
            out.append(OperatorDecision(info.name, now, now, now, Rule.DS2_NO_BUSY_TIME, **common))
            continue
        utilization = target.utilization(now)
        band = (settings.target_utilization - settings.utilization_boundary,
                settings.target_utilization + settings.utilization_boundary)
        if band[0] <= utilization <= band[1]:
            out.append(OperatorDecision(
                info.name, now, now, now, Rule.DS2_IN_BAND, note=(
                    f"busy {utilization:.0%} at the target rate, within {band[0]:.0%}-{band[1]:.0%}"), **common))
            continue
        lowest, highest = bounds(settings, info.key_groups)
        wanted, limited = evenly_spread(target.parallelism, info.key_groups, lowest, highest)
        if utilization < band[0] and wanted > now:
            # The operator keeps up with room to spare: only the input a rescale would pile up asks for more
            # instances, and that input piles up only if we rescale.
            out.append(OperatorDecision(
                info.name, now, now, now, Rule.DS2_BELOW_BAND, note=(
                    f"busy {utilization:.0%} at the target rate, under {band[0]:.0%}; a rescale's own "
                    f"pile-up would need {target.parallelism:.2f}"), **common))
            continue
        note = (f"needs {target.parallelism:.2f}; limited to {wanted} by the bounds" if limited
                else f"needs {target.parallelism:.2f}, rounded to a divisor of {info.key_groups} key groups")
        out.append(OperatorDecision(info.name, now, wanted, wanted, Rule.DS2, note=note, **common))
    return out


def reactive_policy(
    topology: Topology, rates: dict[str, Rates], current: dict[str, int], settings: AutoscalerSettings
) -> list[OperatorDecision]:
    """KEDA-like baseline: one instance more while the backlog per instance is high, one fewer when it is
    low and instances idle; it knows nothing of rates."""
    out = []
    for info in topology.operators:
        rate = rates.get(info.name)
        if rate is None:
            continue
        now = current[info.name]
        per_instance = rate.backlog / max(1, now)
        note = f"backlog {per_instance:,.0f} per instance"
        if per_instance > settings.lag_high_records:
            step, rule, note = 1, Rule.REACTIVE_UP, f"{note} > {settings.lag_high_records:,}"
        elif per_instance < settings.lag_low_records and rate.busy_ratio < settings.target_utilization / 2:
            step, rule, note = -1, Rule.REACTIVE_DOWN, f"{note} < {settings.lag_low_records:,}"
        else:
            step, rule = 0, Rule.REACTIVE_HOLD
        lowest, highest = bounds(settings, info.key_groups)
        wanted = min(highest, max(lowest, now + step))
        out.append(OperatorDecision(info.name, now, wanted, wanted, rule, input_rate=rate.input_per_s,
                                    utilization=rate.busy_ratio, backlog=rate.backlog, note=note))
    return out


POLICIES: dict[str, Policy] = {"ds2": ds2_policy, "reactive": reactive_policy}
