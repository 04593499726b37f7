"""Monthly budget projection for a policy's launches (pure).

Projected spend = what the policy's attempts cost so far this calendar month (UTC), each at
its launch price for the hours it ran inside the month, plus a new attempt at its price from
now to the end of the month. gpuopt alerts at 80% of `budget.monthly_usd` and launches nothing
that would take the projection past 100%.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

ALERT_FRACTION = 0.8


@dataclass(frozen=True, slots=True)
class Spend:
    """(started, ended or None, USD per hour) of one attempt."""

    started: datetime
    ended: datetime | None
    usd_per_hour: float


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    end = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def spent_this_month(attempts: Iterable[Spend], now: datetime) -> float:
    start, _ = month_bounds(now)
    total = 0.0
    for a in attempts:
        begin = max(a.started, start)
        finish = min(a.ended or now, now)
        if finish > begin:
            total += (finish - begin).total_seconds() / 3600 * a.usd_per_hour
    return total


def projected(spent: float, usd_per_hour: float, now: datetime) -> float:
    """Spend so far plus a new attempt at `usd_per_hour` until the month ends."""
    _, end = month_bounds(now)
    return spent + (end - now).total_seconds() / 3600 * usd_per_hour
