"""Decide per operator: what each policy recommends, before the guard rails (guards.py)."""

from __future__ import annotations

from collections.abc import Callable

from streamjobs_core.spec import AutoscalerSettings

from .decision import OperatorDecision, Rule
from .evaluate import Rates, balanced, ds2
from .topology import Topology

Policy = Callable[[Topology, dict[str, Rates], dict[str, int], AutoscalerSettings], list[OperatorDecision]]


def bounds(settings: AutoscalerSettings, key_groups: int) -> tuple[int, int]:
    highest = min(key_groups, settings.max_parallelism or key_groups)
    return min(settings.min_parallelism, highest), highest


def ds2_policy(
    topology: Topology, rates: dict[str, Rates], current: dict[str, int], settings: AutoscalerSettings
) -> list[OperatorDecision]:
    """Per operator: the instances its steady rate needs at the target utilization, and, only while its
    backlog (with what the rescale itself piles up) would not be caught up within catchUpSeconds by their
    headroom, more for the catch-up, with a scale-back to the steady parallelism planned for when it is
    done (the autoscaler carries that out without the scale-down delay)."""
    targets = ds2(topology, rates, settings)
    out = []
    for info in topology.operators:
        if info.name not in targets:
            continue
        target, rate, now = targets[info.name], rates[info.name], current[info.name]
        common = dict(target_rate=target.catch_up_rate, true_rate_per_instance=target.true_rate_per_instance,
                      batch_cost_s=rate.batch_cost_s,
                      input_rate=rate.input_per_s, utilization=rate.busy_ratio, backlog=rate.backlog)
        if target.parallelism is None:
            out.append(OperatorDecision(info.name, now, now, now, Rule.DS2_NO_BUSY_TIME, **common))
            continue
        lowest, highest = bounds(settings, info.key_groups)
        steady, limited = balanced(target.parallelism, info.key_groups, lowest, highest)
        utilization = target.utilization(now)
        band = (settings.target_utilization - settings.utilization_boundary,
                settings.target_utilization + settings.utilization_boundary)
        if band[0] <= utilization <= band[1] and target.catches_up(now, rescaling=False):
            out.append(OperatorDecision(
                info.name, now, now, now, Rule.DS2_IN_BAND, steady_parallelism=steady, note=(
                    f"busy {utilization:.0%} at the steady rate, within {band[0]:.0%}-{band[1]:.0%}"), **common))
            continue
        note = (f"needs {target.parallelism:.2f} for {target.steady_rate:,.0f} rec/s" +
                (f"; limited to {steady} by the bounds" if limited else ""))
        wanted = steady
        if not target.catches_up(steady, rescaling=steady != now):
            catch_up_rate = target.catch_up_rate + target.pile_up_rate  # catching up takes a rescale
            wanted, _ = balanced(catch_up_rate / target.true_rate_per_instance, info.key_groups, lowest, highest)
            wanted = max(wanted, steady)
            if wanted > steady:
                note += (f"; {wanted} catch up the backlog within {settings.catch_up_seconds:g} s, back to "
                         f"{steady} when it is gone")
        out.append(OperatorDecision(info.name, now, wanted, wanted, Rule.DS2, steady_parallelism=steady,
                                    note=note, **common))
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
