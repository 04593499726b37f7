"""Monthly budget projection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from optimizer.jobs.budget import Spend, month_bounds, projected, spent_this_month

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)  # 12 hours before December


def test_month_bounds_roll_over_the_year() -> None:
    assert month_bounds(datetime(2026, 12, 5, tzinfo=UTC)) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )


def test_spend_counts_only_hours_inside_this_month() -> None:
    attempts = [
        Spend(datetime(2026, 10, 31, 12, tzinfo=UTC), datetime(2026, 11, 1, 12, tzinfo=UTC), 2.0),
        Spend(NOW - timedelta(hours=3), None, 10.0),  # still running
    ]
    assert spent_this_month(attempts, NOW) == pytest.approx(12 * 2.0 + 3 * 10.0)


def test_projection_adds_the_new_attempt_to_month_end() -> None:
    assert projected(100.0, 4.0, NOW) == pytest.approx(100.0 + 12 * 4.0)
