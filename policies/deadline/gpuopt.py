"""gpuopt's deadline strategy: a price on the slack. The rule and its cases:
docs/deadlines.md.

Each zone is seen as a two-state (up/down) Markov chain whose mean spell lengths come from
its `ZoneStats`. From them, the time without progress that riding spot to the end would
take (down spells and one restart per interruption) has a mean and a variance, and so a
chance P that the slack in hand will not cover it (the slack binds). A second of slack is
then worth P x (on-demand - spot) per second: spent waiting, it is a second more of
on-demand later with chance P. On-demand now costs (1 - P) x (on-demand - spot) per second:
its work displaces spot work later unless the slack binds. Each decision compares these
with the restarts it costs, so it waits through down spells while the slack is plentiful,
rides on-demand through a down spell once waiting costs more, and leaves on-demand for an
up spell expected to pay for its two restarts.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import erf, sqrt

from policies.deadline.model import DeadlineStrategy, Decision, Situation, Use, hours, slack_s
from policies.deadline.strategies import (
    availability,
    decision,
    leave_margin_s,
    mean_down_s,
    mean_up_s,
    safety_net,
    spot_here,
    spot_ratio,
)

# Below this chance that the slack binds, on-demand is left to wait for spot (not 0.5:
# hysteresis, as each switch costs a restart).
STAY_ON_DEMAND = 0.4
# The down spells still to come are counted as if spot were ridden to the end; riding
# on-demand through the long ones finishes sooner, so fewer come: each spell's share of
# the slack is raised by half (tuned on the 2023 V100 traces: docs/deadlines.md).
SHARE = 1.5
PATIENCE_CAP = 4.0  # a down spell waits at most this many shares of the slack
TRIPS = 1.5  # round trips (on-demand and back) kept in the slack per down spell to come
TAIL = 2.0  # the expected rest of a spell grows by this much per second it has lasted


@dataclass(frozen=True, slots=True)
class Outlook:
    bind: float  # chance that the slack does not cover riding spot to the end
    up_s: float  # the mean up spell of the zones at hand
    down_s: float  # the mean time with no zone up
    spells: float  # down spells expected before the work is done


def outlook(s: Situation) -> Outlook:
    zones = set(s.spot_now) | set(s.stats) or {""}
    # Zones are not independent: interruptions often come together (docs/deadlines.md).
    # The chance that none is up is taken between the best zone's alone and the product
    # of all (a weighted geometric mean: on the 2023 V100 traces it is 0.8% for 9 zones,
    # 9.5% for the best alone, 0.001% for the product).
    best = max(availability(s.stats.get(z)) for z in zones)
    none_up = 1.0
    for z in zones:
        none_up *= 1.0 - availability(s.stats.get(z))
    down = min(0.999, (1.0 - best) ** (2.0 / 3.0) * none_up ** (1.0 / 3.0))
    up_s = max(mean_up_s(s.stats.get(z)) for z in zones)
    down_s = (
        min(mean_down_s(s.stats.get(z)) for z in zones)
        if len(zones) == 1
        else (up_s * down / (1.0 - down))
    )
    # interruptions expected before the work is done: a job does not always run in the
    # steadiest zone, so with several zones the median zone's up spell counts them
    ups = sorted(mean_up_s(s.stats.get(z)) for z in zones)
    spells = s.work_left_s / ups[len(ups) // 2]
    mean = spells * (down_s + s.overhead_s)
    if not s.spot_now:  # and the rest of the down spell under way
        mean += remaining_s(down_s, down_age_s(s))
    spread = sqrt(2.0 * spells) * down_s + 1.0
    room = slack_s(s) - reserve_s(s)
    bind = 0.5 * (1.0 + erf((mean - room) / (spread * sqrt(2.0))))
    return Outlook(bind=bind, up_s=up_s, down_s=down_s, spells=spells)


def remaining_s(mean_s: float, age_s: float | None) -> float:
    """The expected rest of a spell of that age: spells are long-tailed (a Lomax law of
    shape 1.5 has mean + 2 x age), so a spell that has lasted is likely to last."""
    return mean_s + TAIL * (age_s or 0.0)


def proving_s(s: Situation, zone: str, slack: float) -> float:
    """How long an up spell must have lasted before on-demand is left for it: zero while
    the slack pays for a round trip (two restarts) per up spell still to come; otherwise
    the age that only the longest up spells reach, as many as there are round trips to pay
    for (a Lomax law of shape 1.5: P(longer than a) = (1 + a / scale)^-1.5)."""
    if s.overhead_s <= 0 or len(s.stats) > 1:  # with several zones, moves come cheaper
        return 0.0
    trips = (slack - reserve_s(s)) / (2.0 * s.overhead_s)
    seen = s.stats.get(zone)
    cycle = mean_up_s(seen) + mean_down_s(seen)
    spells = (s.deadline_s - s.elapsed_s) / cycle
    if trips >= spells:
        return 0.0
    if trips <= 0:
        return s.deadline_s  # never
    return 0.5 * mean_up_s(seen) * ((spells / trips) ** (2.0 / 3.0) - 1.0)


def patience_s(budget_s: float, mean_s: float) -> float:
    """How long to wait into each down spell so that, on average, a spell takes `budget_s`
    of slack: for a Lomax law of shape 1.5 and mean m, E[min(spell, t)] =
    m (1 - (1 + t / (m / 2))^-0.5). Long tails: most spells end early, so the wait can be
    several times the budget, though never more than PATIENCE_CAP times (the mean is an
    estimate, and one spell far longer than it would take several spells' slack)."""
    if budget_s <= 0:
        return 0.0
    if budget_s >= mean_s:
        return PATIENCE_CAP * budget_s
    return min(PATIENCE_CAP * budget_s, 0.5 * mean_s * ((1.0 - budget_s / mean_s) ** -2.0 - 1.0))


def steadiest_zone(s: Situation) -> str | None:
    """Of the zones with spot now: the current one, else the one whose up spell is expected
    to last longest given how long it has lasted (a zone that just came back is likely to
    go again: interruptions come in waves)."""
    if s.zone in s.spot_now:
        return s.zone

    def rest(z: str) -> float:
        seen = s.stats.get(z)
        return remaining_s(mean_up_s(seen), seen.spell_s if seen else None)

    return min(sorted(s.spot_now), key=lambda z: -rest(z), default=None)


def down_age_s(s: Situation) -> float | None:
    """How long no zone has had spot (the youngest down spell), where known."""
    ages = [st.spell_s for st in s.stats.values()]
    if not ages or any(a is None for a in ages):
        return None
    return min(a for a in ages if a is not None)


def reserve_s(s: Situation) -> float:
    """Slack kept above the safety net so that on-demand can still be left for spot (the
    greedy trap: on-demand for good once the slack is gone)."""
    return leave_margin_s(s) + s.overhead_s


class Gpuopt(DeadlineStrategy):
    """The slack priced by the chance that it binds, several zones, hysteresis, and the
    safety net."""

    name = "gpuopt"

    def decide(self, s: Situation) -> Decision:
        net = safety_net(s)
        if net is not None:
            return net
        slack = slack_s(s)
        if spot_here(s):
            return decision(s, Use.SPOT, s.zone, f"slack {hours(slack)}: spot in {s.zone}")
        look = outlook(s)
        ratio = spot_ratio(s)
        extra = 1.0 - ratio  # on-demand over spot, per on-demand price
        worth = look.bind * extra  # what a second of slack is worth
        o = s.overhead_s
        zone = steadiest_zone(s)
        if zone is not None:
            if s.running is not Use.ON_DEMAND:
                return decision(s, Use.SPOT, zone, f"slack {hours(slack)}: spot in {zone}")
            seen = s.stats.get(zone)
            up_s = min(remaining_s(mean_up_s(seen), seen.spell_s if seen else None), s.work_left_s)
            gain = extra * up_s
            cost = o * (ratio + 1.0 + 2.0 * worth)
            wait_s = proving_s(s, zone, slack)
            if seen is not None and seen.spell_s is not None and seen.spell_s < wait_s:
                return decision(
                    s,
                    Use.ON_DEMAND,
                    None,
                    f"slack for few restarts: spot in {zone} must last {hours(wait_s)} first",
                )
            if gain > cost and slack >= leave_margin_s(s) + o:
                return decision(s, Use.SPOT, zone, f"up spell pays its restarts: spot in {zone}")
            return decision(
                s, Use.ON_DEMAND, None, f"up spells in {zone} too short to leave on-demand"
            )
        if s.running is Use.ON_DEMAND:
            if look.bind < STAY_ON_DEMAND:
                return decision(
                    s, Use.WAIT, None, f"slack {hours(slack)} likely enough: wait for spot"
                )
            return decision(s, Use.ON_DEMAND, None, f"no spot, slack {hours(slack)}: on-demand")
        age = down_age_s(s)
        down_s = remaining_s(look.down_s, age)
        wait_cost = worth * down_s
        od_cost = o * (1.0 + worth) + (1.0 - look.bind) * extra * max(0.0, down_s - o)
        # While the slack binds, each down spell may take its share of the slack above the
        # reserve and the restarts still to come: short spells are waited out, long ones
        # ridden on on-demand.
        spells = max(1.0, look.spells)
        share = patience_s(
            SHARE * (slack - reserve_s(s) - TRIPS * spells * o) / spells, look.down_s
        )
        if wait_cost > od_cost and (age is None or age >= share):
            return decision(
                s,
                Use.ON_DEMAND,
                None,
                f"no spot, slack {hours(slack)} binds with chance {look.bind:.0%}: on-demand",
            )
        return decision(s, Use.WAIT, None, f"slack {hours(slack)}: wait for spot")
