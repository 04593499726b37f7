"""The reference deadline strategies and the safety net every strategy shares.

`greedy` and `uniform-progress` are the references of docs/deadlines.md; `gpuopt` (gpuopt.py)
is the default; registry.py names them. Every strategy starts with `safety_net`, which is
what makes a deadline that was feasible at the start (work + one restart <= deadline) never
missed under the model: at every decision the slack stays >= 0, so on-demand from there
still meets the deadline.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.deadline.model import (
    DEFAULT_SPOT_RATIO,
    DeadlineStrategy,
    Decision,
    Situation,
    Use,
    ZoneStats,
    at_risk,
    hours,
    slack_s,
)

# A zone never watched counts as this much watched time: up half of it, one interruption
# (a 2 h mean up spell), so that the first minutes of data do not swing the estimates.
PRIOR_OBSERVED_S = 4 * 3600.0
PRIOR_AVAILABLE_S = 2 * 3600.0
PRIOR_INTERRUPTIONS = 1.0


def net_margin_s(s: Situation) -> float:
    """The slack the safety net keeps off on-demand: one restart and one interval."""
    return s.overhead_s + s.interval_s


def leave_margin_s(s: Situation) -> float:
    """The slack needed to leave on-demand: the margin, plus two restarts (the start
    elsewhere and the way back) and the interval before the next look."""
    return net_margin_s(s) + 2 * s.overhead_s + s.interval_s


def decision(s: Situation, use: Use, zone: str | None, reason: str) -> Decision:
    return Decision(use=use, zone=zone, reason=reason, at_risk=at_risk(s))


def safety_net(s: Situation) -> Decision | None:
    """On-demand without a break once the slack no longer pays for one more restart and one
    interval off it (or, on on-demand, for leaving it and coming back)."""
    slack = slack_s(s)
    if s.running is Use.ON_DEMAND:
        if slack < leave_margin_s(s):
            return decision(
                s,
                Use.ON_DEMAND,
                None,
                f"slack {hours(slack)} < {hours(leave_margin_s(s))}: stay on on-demand",
            )
        return None
    if slack < net_margin_s(s):
        # spot alone can no longer be trusted with the deadline: one more interruption (a
        # restart, and an interval before the next look) would miss it, so this is the
        # moment the deadline is at risk
        return Decision(
            Use.ON_DEMAND,
            None,
            f"slack {hours(slack)} < {hours(net_margin_s(s))}: on-demand to the end",
            at_risk=True,
        )
    return None


def spot_ratio(s: Situation) -> float:
    if s.spot_price is not None and s.on_demand_price:
        return max(0.0, min(1.0, s.spot_price / s.on_demand_price))
    return DEFAULT_SPOT_RATIO


def availability(stats: ZoneStats | None) -> float:
    """The share of time spot was obtainable, with the prior folded in."""
    observed = PRIOR_OBSERVED_S + (stats.observed_s if stats else 0.0)
    return (PRIOR_AVAILABLE_S + (stats.available_s if stats else 0.0)) / observed


def mean_up_s(stats: ZoneStats | None) -> float:
    """The mean length of an up spell (spot obtainable without a break)."""
    available = PRIOR_AVAILABLE_S + (stats.available_s if stats else 0.0)
    return available / (PRIOR_INTERRUPTIONS + (stats.interruptions if stats else 0))


def mean_down_s(stats: ZoneStats | None) -> float:
    """The mean length of a down spell."""
    observed = PRIOR_OBSERVED_S + (stats.observed_s if stats else 0.0)
    down = observed - PRIOR_AVAILABLE_S - (stats.available_s if stats else 0.0)
    return down / (PRIOR_INTERRUPTIONS + (stats.interruptions if stats else 0))


def best_zone(s: Situation, zones: Iterable[str]) -> str | None:
    """Of the zones given, the current one, else the one with the longest expected up spell
    (then the name, so that the answer is the same every time)."""
    pool = sorted(zones)
    if not pool:
        return None
    if s.zone in pool:
        return s.zone
    return min(pool, key=lambda z: (-mean_up_s(s.stats.get(z)), z))


def spot_here(s: Situation) -> bool:
    """Spot runs now and its zone still has it."""
    return s.running is Use.SPOT and s.zone in s.spot_now


class Greedy(DeadlineStrategy):
    """Spot whenever some zone has it, nothing otherwise; on-demand once the slack is gone,
    and then for good."""

    name = "greedy"

    def decide(self, s: Situation) -> Decision:
        if s.running is Use.ON_DEMAND:
            return decision(s, Use.ON_DEMAND, None, "on on-demand: stays to the end")
        net = safety_net(s)
        if net is not None:
            return net
        zone = best_zone(s, s.spot_now)
        if zone is not None:
            return decision(s, Use.SPOT, zone, f"slack {hours(slack_s(s))}: spot in {zone}")
        return decision(s, Use.WAIT, None, f"slack {hours(slack_s(s))}: no spot, wait")


class UniformProgress(DeadlineStrategy):
    """Can't Be Late's Uniform Progress (Wu et al., NSDI 2024), from the paper's description:
    keep the progress at or above the line work / deadline x elapsed; spot when a zone has
    it, on-demand when behind the line, nothing when ahead; plus the safety net."""

    name = "uniform-progress"

    def decide(self, s: Situation) -> Decision:
        net = safety_net(s)
        if net is not None:
            return net
        work = s.work_s if s.work_s is not None else s.elapsed_s + s.work_left_s
        done = work - s.work_left_s
        line = work * s.elapsed_s / s.deadline_s if s.deadline_s > 0 else work
        zone = best_zone(s, s.spot_now)
        if zone is not None:
            return decision(s, Use.SPOT, zone, f"spot in {zone}")
        if done < line:
            return decision(
                s, Use.ON_DEMAND, None, f"progress {hours(done)} < line {hours(line)}: on-demand"
            )
        return decision(s, Use.WAIT, None, f"progress {hours(done)} >= line {hours(line)}: wait")
