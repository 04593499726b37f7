"""The one budget model (policies/budget.py), at fixed instants: never the real calendar."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from policies import budget
from policies.budget import Committed, Spend

# 2026-03-14 12:00 UTC: 420 h to the end of March
NOW = datetime(2026, 3, 14, 12, tzinfo=UTC)
HOURS_LEFT = 420.0


def test_month_bounds_and_hours_left_use_the_given_instant() -> None:
    assert budget.month_bounds(NOW) == (
        datetime(2026, 3, 1, tzinfo=UTC),
        datetime(2026, 4, 1, tzinfo=UTC),
    )
    december = datetime(2026, 12, 31, 23, tzinfo=UTC)
    assert budget.month_bounds(december)[1] == datetime(2027, 1, 1, tzinfo=UTC)
    assert budget.hours_left(NOW) == HOURS_LEFT
    assert budget.hours_left(NOW, hours_per_month=100) == 100


def test_spend_counts_this_month_only_and_live_attempts_at_their_current_price() -> None:
    start = datetime(2026, 3, 1, tzinfo=UTC)
    spends = [
        # ran 10 h across the month start, 2 of them in March, at $5/h: $10
        Spend(start - timedelta(hours=8), start + timedelta(hours=2), 5.0),
        # live for 4 h at a launch price of $2/h ($8), listed at $3/h now
        Spend(NOW - timedelta(hours=4), None, 2.0, current_usd_per_hour=3.0),
        # live for 1 h at $1/h, no longer listed: its launch price
        Spend(NOW - timedelta(hours=1), None, 1.0),
    ]
    assert budget.committed(spends, NOW) == Committed(
        spent_usd=pytest.approx(19.0), live_usd_per_hour=4.0, live_attempts=2
    )
    # what a $6/h launch brings the month to: 19 + (3 + 1 + 6) x 420
    assert budget.projected(budget.committed(spends, NOW), 6.0, NOW) == pytest.approx(4219.0)


def test_two_concurrent_jobs_are_both_in_the_projection() -> None:
    # One job launched an hour ago at $10/h under a $5,000 budget; a second asks for $10/h.
    # Spend so far plus the new attempt alone ($10 + $4,200) would fit, but both running to
    # the end of the month cost $8,410.
    first = Spend(NOW - timedelta(hours=1), None, 10.0)
    spend = budget.committed([first], NOW)
    assert budget.projected(spend, 10.0, NOW) == pytest.approx(10 + 20 * HOURS_LEFT)
    assert budget.projected(spend, 10.0, NOW) > 5000


def test_projection_adds_the_new_attempt_to_month_end() -> None:
    before_december = datetime(2026, 11, 30, 12, tzinfo=UTC)  # 12 hours before December
    spend = Committed(spent_usd=100.0)
    assert budget.projected(spend, 4.0, before_december) == pytest.approx(100.0 + 12 * 4.0)
