"""The one monthly budget model (pure): what a launch would bring a policy's month to.

Projected spend for a launch at `usd_per_hour`, at `now` =
  what the policy's attempts cost so far this calendar month (UTC), as the cost ledger
  prices them (docs/costs.md: billed time, spot prices in effect, refunds, root volumes),
+ every live attempt of the policy at its current price, from now to the end of the month,
+ the new attempt at its price, from now to the end of the month.

A multi-node attempt (a gang of N instances) costs N instances' prices: a live gang is one
`Live` of N instances, and a launch of a gang projects its offer's price N times (`instances`).

With `budget.hours_per_month` set, a live or new attempt is projected for at most that many
more hours this month (work that runs part-time). The budget rule of the ranking and the
launch check both read this module, and they agree because they take the same inputs: the
policy, `now`, and a `Committed` (spend so far and the live attempts' prices), which the
caller gathers from the ledger (optimizer/jobs/budget.py). gpuopt alerts at 80% of
`budget.monthly_usd` and launches nothing whose projection passes 100%.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

ALERT_FRACTION = 0.8


@dataclass(frozen=True, slots=True)
class Live:
    """A live attempt of the policy: its launch price per instance, its pool's current price
    per instance (None: the launch price) for the rest of the month, and how many instances
    it runs (a gang's nodes)."""

    usd_per_hour: float
    current_usd_per_hour: float | None = None
    instances: int = 1

    @property
    def price(self) -> float:
        """USD/h of the whole attempt, every instance at the current price."""
        each = self.usd_per_hour if self.current_usd_per_hour is None else self.current_usd_per_hour
        return each * self.instances


@dataclass(frozen=True, slots=True)
class Committed:
    """What a policy is committed to at one instant: USD spent so far this month, and the
    summed current USD/h of its live attempts (which run on until the month ends); a gang
    is one attempt of `nodes` instances."""

    spent_usd: float = 0.0
    live_usd_per_hour: float = 0.0
    live_attempts: int = 0
    live_instances: int = 0


NOTHING = Committed()


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """The start and end of `now`'s calendar month, UTC."""
    now = now.astimezone(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    end = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def hours_left(now: datetime, hours_per_month: float | None = None) -> float:
    """Hours an attempt running from `now` is projected to run this month."""
    _, end = month_bounds(now)
    left = (end - now).total_seconds() / 3600
    return left if hours_per_month is None else min(left, hours_per_month)


def committed(spent_usd: float, live: Iterable[Live]) -> Committed:
    """What the policy is committed to: `spent_usd` so far this month (the ledger's figure)
    and its live attempts, each at its current price."""
    attempts = list(live)
    return Committed(
        spent_usd,
        sum(a.price for a in attempts),
        len(attempts),
        sum(a.instances for a in attempts),
    )


def projected(
    spend: Committed,
    usd_per_hour: float,
    now: datetime,
    hours_per_month: float | None = None,
    *,
    instances: int = 1,
) -> float:
    """The month's projected spend if an attempt of `instances` instances (a gang's nodes), each
    at `usd_per_hour`, launched at `now`."""
    new = usd_per_hour * instances
    return spend.spent_usd + (spend.live_usd_per_hour + new) * hours_left(now, hours_per_month)


def live_text(spend: Committed) -> str:
    """The live attempts as a budget reason names them: `2 live` (single instances), or
    `1 live (3 instances)` once a gang is among them; empty with none."""
    if not spend.live_attempts:
        return ""
    more = spend.live_instances > spend.live_attempts
    return f"{spend.live_attempts} live" + (f" ({spend.live_instances} instances)" if more else "")
