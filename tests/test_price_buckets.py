"""Price history read in a chart's buckets, on SQLite and PostgreSQL: each bucket's lowest
price in effect (the carried-in price counts until the bucket's first point) and the price at
its end, across both tiers, with points on a bucket's edge in the bucket they start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from optimizer.store import Grid, InEffect, Retention, Store
from optimizer.store.buckets import BucketRow, fill
from tests.helpers import make_offer

T = datetime(2026, 3, 14, 12, 0, tzinfo=UTC)  # on the hour
POOL = make_offer().pool  # aws us-east-1 use1-az1 g5.xlarge spot


def record(store: Store, points: list[tuple[datetime, float]], **pool: object) -> None:
    store.prices.record_offers(
        make_offer(observed_at=at, usd_per_hour=usd, **pool) for at, usd in points
    )


def test_a_grid_is_the_narrowest_aligned_one_within_the_bucket_limit() -> None:
    grid = Grid.over(T + timedelta(minutes=7), T + timedelta(days=2), 300)
    # 2 days in 10-minute buckets: 289 (5-minute ones would be 577)
    assert (grid.origin, grid.width_s, grid.count) == (T, 600, 289)
    assert grid.until == T + timedelta(days=2, minutes=10)
    month = Grid.over(T - timedelta(days=30), T, 300)
    assert month.width_s == 3 * 3600 and month.count == 241
    assert Grid.over(T, T + timedelta(days=400), 10).width_s == 45 * 86400
    with pytest.raises(ValueError, match="later"):
        Grid.over(T, T, 300)


def test_fill_carries_prices_through_empty_buckets() -> None:
    grid = Grid(T, 600, 4)
    rows = [
        BucketRow(-1, -3600, 5.0, 5.0),
        BucketRow(1, 120, 7.0, 8.0),
    ]
    assert fill(rows, grid) == [
        InEffect(5.0, 5.0),
        InEffect(5.0, 8.0),  # 5.0 held until 12:12
        InEffect(8.0, 8.0),
        InEffect(8.0, 8.0),
    ]
    assert fill([], grid) == [None] * 4


def test_buckets_hold_the_lowest_price_in_effect_and_the_price_at_their_end(
    store: Store,
) -> None:
    record(
        store,
        [
            (T - timedelta(minutes=30), 5.0),  # in effect when the grid starts
            (T, 3.0),  # on bucket 0's edge: 5.0 is not in effect in bucket 0
            (T + timedelta(minutes=5, seconds=30), 2.0),
            (T + timedelta(minutes=9, seconds=59, microseconds=500_000), 4.0),
            (T + timedelta(minutes=10), 6.0),  # on bucket 1's edge
            (T + timedelta(minutes=35), 1.0),  # 6.0 held in bucket 3 until then
            (T + timedelta(minutes=50), 0.5),  # past the grid
        ],
    )
    record(store, [(T + timedelta(minutes=1), 9.0)], zone="use1-az2")  # another pool
    grid = Grid(T, 600, 5)
    (found, other) = store.prices.price_buckets([POOL, make_offer(zone="use1-az2").pool], grid)
    assert found == [
        InEffect(2.0, 4.0),
        InEffect(6.0, 6.0),
        InEffect(6.0, 6.0),
        InEffect(1.0, 1.0),
        InEffect(1.0, 1.0),
    ]
    assert other == [InEffect(9.0, 9.0)] * 5
    assert store.prices.price_buckets([make_offer(zone="none").pool], grid) == [[None] * 5]


def test_buckets_read_the_hourly_tier_past_the_raw_retention(store: Store) -> None:
    h = T - timedelta(days=20)
    record(
        store,
        [
            (h + timedelta(minutes=10), 2.0),
            (h + timedelta(minutes=20), 4.0),
            (h + timedelta(minutes=50), 9.0),  # hour h: median 4.0
            (h + timedelta(hours=1, minutes=15), 1.0),
            (h + timedelta(hours=1, minutes=45), 3.0),  # hour h+1: median 2.0
        ],
    )
    store.prices.prune_history(Retention(timedelta(days=14), timedelta(days=400)), now=T)
    grid = Grid(h - timedelta(hours=1), 3600, 4)
    assert store.prices.price_buckets([POOL], grid) == [
        [None, InEffect(4.0, 4.0), InEffect(2.0, 2.0), InEffect(2.0, 2.0)]
    ]
    # half-hour buckets: each hour's median from the start of its hour
    halves = Grid(h, 1800, 3)
    assert store.prices.price_buckets([POOL], halves) == [
        [InEffect(4.0, 4.0), InEffect(4.0, 4.0), InEffect(2.0, 2.0)]
    ]
