"""gpuopt's deadline strategy: spot while the slack can pay for the down spells still to
come, on-demand through a down spell once it cannot, back to spot when an up spell is
expected to pay for the two restarts. The rule and its cases: docs/deadlines.md.

Each zone is seen as a two-state (up/down) Markov chain whose mean spell lengths come from
its `ZoneStats`; from them, the slack that riding spot to the end is expected to need.
"""

from __future__ import annotations

from policies.deadline.model import DeadlineStrategy, Decision, Situation, Use, hours, slack_s
from policies.deadline.strategies import (
    availability,
    best_zone,
    decision,
    leave_margin_s,
    mean_up_s,
    safety_net,
    spot_here,
    spot_ratio,
)


def expected_off_s(s: Situation) -> float:
    """The time without progress that riding spot through the work left is expected to take:
    the down time (no zone up) and one restart per interruption."""
    zones = set(s.spot_now) | set(s.stats)
    if not zones:
        zones = {""}
    # Zones are taken as independent; interruptions often come together (docs/deadlines.md),
    # so the chance that none is up is not allowed below the best zone's alone by more than
    # half.
    best = max(availability(s.stats.get(z)) for z in zones)
    none_up = 1.0
    for z in zones:
        none_up *= 1.0 - availability(s.stats.get(z))
    down = 0.5 * ((1.0 - best) + none_up)
    up = max(1e-6, 1.0 - down)
    spell = max(mean_up_s(s.stats.get(z)) for z in zones)
    return s.work_left_s * down / up + s.work_left_s / spell * s.overhead_s


def reserve_s(s: Situation) -> float:
    """Slack kept in hand above the safety net, so that on-demand can still be left for
    spot when it comes back (the greedy trap: on-demand for good once the slack is gone)."""
    return leave_margin_s(s) + s.overhead_s + s.interval_s


def target_s(s: Situation) -> float:
    """The slack to keep now: the reserve, plus the smaller of the expected need and a
    share of the starting slack in proportion to the work left (the pace)."""
    work = s.work_s if s.work_s is not None else s.elapsed_s + s.work_left_s
    start_slack = s.deadline_s - work - s.overhead_s
    reserve = reserve_s(s)
    pace = max(0.0, start_slack - reserve) * (s.work_left_s / work if work > 0 else 0.0)
    return reserve + min(expected_off_s(s), pace)


class Gpuopt(DeadlineStrategy):
    """Slack-paced spot with a hard safety net, several zones and hysteresis."""

    name = "gpuopt"

    def decide(self, s: Situation) -> Decision:
        net = safety_net(s)
        if net is not None:
            return net
        slack = slack_s(s)
        if spot_here(s):
            return decision(s, Use.SPOT, s.zone, f"slack {hours(slack)}: spot in {s.zone}")
        target = target_s(s)
        zone = best_zone(s, s.spot_now)
        if zone is not None:
            if s.running is not Use.ON_DEMAND:
                return decision(s, Use.SPOT, zone, f"slack {hours(slack)}: spot in {zone}")
            # Leave on-demand only where the up spell is expected to pay for two restarts
            # (the start on spot, the way back later) and, while the slack is short, for
            # the slack they take.
            ratio = spot_ratio(s)
            gain = (1.0 - ratio) * min(mean_up_s(s.stats.get(zone)), s.work_left_s)
            cost = s.overhead_s * (1.0 + ratio)
            if slack - 2 * s.overhead_s < target:
                cost += 2 * s.overhead_s * (1.0 - ratio)
            if gain > cost:
                return decision(s, Use.SPOT, zone, f"slack {hours(slack)}: spot back in {zone}")
            return decision(
                s, Use.ON_DEMAND, None, f"up spells in {zone} too short to leave on-demand"
            )
        if s.running is Use.ON_DEMAND:
            # Stop paying on-demand only with the slack well above the target (hysteresis:
            # every switch costs a restart).
            spare = slack - s.overhead_s - target
            if spare > s.overhead_s + s.interval_s:
                return decision(
                    s, Use.WAIT, None, f"slack {hours(slack)} > {hours(target)}: wait for spot"
                )
            return decision(s, Use.ON_DEMAND, None, f"no spot, slack {hours(slack)}: on-demand")
        if slack > target:
            return decision(
                s, Use.WAIT, None, f"slack {hours(slack)} > {hours(target)}: wait for spot"
            )
        return decision(
            s, Use.ON_DEMAND, None, f"no spot, slack {hours(slack)} <= {hours(target)}: on-demand"
        )
