"""The one budget model (policies/budget.py), at fixed instants: never the real calendar."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from policies import budget
from policies.budget import Committed, Live

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


def test_live_attempts_count_at_their_current_price_else_their_launch_price() -> None:
    live = [
        Live(2.0, current_usd_per_hour=3.0),  # launched at $2/h, listed at $3/h now
        Live(1.0),  # no longer listed: its launch price
    ]
    # $19 spent so far this month, as the ledger prices it
    assert budget.committed(19.0, live) == Committed(
        spent_usd=19.0, live_usd_per_hour=4.0, live_attempts=2, live_instances=2
    )
    # what a $6/h launch brings the month to: 19 + (3 + 1 + 6) x 420
    assert budget.projected(budget.committed(19.0, live), 6.0, NOW) == pytest.approx(4219.0)
    # a cheaper current price lowers the projection: the live attempt is not at its launch price
    cheaper = budget.committed(19.0, [Live(2.0, current_usd_per_hour=0.5), Live(1.0)])
    assert budget.projected(cheaper, 6.0, NOW) == pytest.approx(19 + 7.5 * HOURS_LEFT)


def test_two_concurrent_jobs_are_both_in_the_projection() -> None:
    # One job launched an hour ago at $10/h under a $5,000 budget; a second asks for $10/h.
    # Spend so far plus the new attempt alone ($10 + $4,200) would fit, but both running to
    # the end of the month cost $8,410.
    spend = budget.committed(10.0, [Live(10.0)])
    assert budget.projected(spend, 10.0, NOW) == pytest.approx(10 + 20 * HOURS_LEFT)
    assert budget.projected(spend, 10.0, NOW) > 5000


def test_hours_per_month_caps_each_live_and_new_attempt() -> None:
    spend = budget.committed(100.0, [Live(2.0)])
    assert budget.projected(spend, 3.0, NOW, hours_per_month=10) == pytest.approx(100 + 5 * 10)


def test_projection_adds_the_new_attempt_to_month_end() -> None:
    before_december = datetime(2026, 11, 30, 12, tzinfo=UTC)  # 12 hours before December
    spend = Committed(spent_usd=100.0)
    assert budget.projected(spend, 4.0, before_december) == pytest.approx(100.0 + 12 * 4.0)
