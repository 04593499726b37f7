"""Price history's two tiers on SQLite and PostgreSQL: raw points age into hourly
min/median/max rows and then out; a pass is idempotent, bounded per batch and crash-safe; and
the points in effect read across the tier boundary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from optimizer.model import Market
from optimizer.store import PruneBatch, Retention, Store, Tier
from optimizer.store import history as history_module
from optimizer.store.history import HourSummary, floor_hour, merge, summarize
from optimizer.store.tables import PriceHistory, PriceHourly
from tests.helpers import make_offer

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)  # on the hour
DAYS14 = Retention(raw=timedelta(days=14), hourly=timedelta(days=400))
POOL = make_offer().pool  # aws us-east-1 use1-az1 g5.xlarge spot


def record(store: Store, points: list[tuple[datetime, float]], **pool: object) -> None:
    store.prices.record_offers(
        make_offer(observed_at=at, usd_per_hour=usd, **pool) for at, usd in points
    )


def count(store: Store, table: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def hourly_rows(store: Store) -> list[tuple[object, ...]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(
                PriceHourly.zone,  # type: ignore[arg-type]
                PriceHourly.hour,  # type: ignore[arg-type]
                PriceHourly.min_usd,  # type: ignore[arg-type]
                PriceHourly.median_usd,  # type: ignore[arg-type]
                PriceHourly.max_usd,  # type: ignore[arg-type]
                PriceHourly.points,  # type: ignore[arg-type]
            ).order_by(PriceHourly.zone, PriceHourly.hour)  # type: ignore[arg-type]
        )
        return [tuple(row) for row in rows]


def prune_all(
    store: Store, retention: Retention = DAYS14, now: datetime = NOW, **bounds: int
) -> list[PruneBatch]:
    """A whole pass, batch after batch, as the loop runs it."""
    batches, after = [], None
    while True:
        batch = store.prices.prune_history(retention, now=now, after=after, **bounds)
        batches.append(batch)
        if batch.done:
            return batches
        after = batch.after
        assert len(batches) < 10_000, "the pass does not end"


# -- the pure summary ------------------------------------------------------------------------


def test_an_hour_summarizes_to_min_median_max_and_count() -> None:
    h = datetime(2026, 3, 1, 7, tzinfo=UTC)
    points = [
        (h + timedelta(minutes=50), 3.0),
        (h, 1.0),
        (h + timedelta(minutes=10), 2.0),
        (h + timedelta(hours=1), 4.0),  # the next hour
        (h + timedelta(hours=1, minutes=59, seconds=59), 6.0),
    ]
    assert summarize(points) == [
        HourSummary(h, 1.0, 2.0, 3.0, 3),
        HourSummary(h + timedelta(hours=1), 4.0, 5.0, 6.0, 2),  # even: mean of the middle two
    ]


def test_hours_are_utc_hours_whatever_the_offset() -> None:
    india = timezone(timedelta(hours=5, minutes=30))
    at = datetime(2026, 3, 1, 15, 29, 59, tzinfo=india)  # 09:59:59 UTC
    assert floor_hour(at) == datetime(2026, 3, 1, 9, tzinfo=UTC)


def test_a_late_point_merges_into_a_summarized_hour() -> None:
    h = datetime(2026, 3, 1, 7, tzinfo=UTC)
    held = HourSummary(h, 1.0, 2.0, 3.0, 3)
    later = summarize([(h + timedelta(minutes=5), 10.0)])[0]
    # the held median stands for its 3 points: median of [2, 2, 2, 10] = 2
    assert merge(held, later, [10.0]) == HourSummary(h, 1.0, 2.0, 10.0, 4)


def test_retention_must_keep_hourly_longer_than_raw() -> None:
    with pytest.raises(ValueError, match="longer"):
        Retention(raw=timedelta(days=14), hourly=timedelta(days=14))
    with pytest.raises(ValueError, match="positive"):
        Retention(raw=timedelta(0), hourly=timedelta(days=1))


# -- pruning in the store --------------------------------------------------------------------


def test_downsampling_writes_each_old_hour_once_and_removes_its_points(store: Store) -> None:
    old = NOW - timedelta(days=20)  # on the hour
    record(
        store,
        [
            (old, 0.50),
            (old + timedelta(minutes=20), 0.30),
            (old + timedelta(minutes=40), 0.40),
            (old + timedelta(hours=1, minutes=5), 0.70),
            (old + timedelta(hours=1, minutes=55), 0.90),
            (NOW - timedelta(days=1), 0.45),  # recent: stays raw
        ],
    )
    batches = prune_all(store)

    assert sum(b.summarized for b in batches) == 5
    assert sum(b.hours for b in batches) == 2
    assert hourly_rows(store) == [
        ("use1-az1", old, 0.30, 0.40, 0.50, 3),
        ("use1-az1", old + timedelta(hours=1), 0.70, 0.80, 0.90, 2),
    ]
    assert store.prices.price_history(*POOL, since=NOW - timedelta(days=2)) == [
        (NOW - timedelta(days=1), 0.45)
    ]
    assert count(store, PriceHistory) == 1


def test_the_raw_boundary_is_exactly_the_retention(store: Store) -> None:
    edge = NOW - timedelta(days=14)  # NOW is on the hour, so the cutoff is exactly here
    record(store, [(edge - timedelta(seconds=1), 1.0), (edge, 2.0)])
    prune_all(store)

    points = store.prices.price_points(*POOL)
    assert [(p.at, p.tier, p.usd_per_hour) for p in points] == [
        (floor_hour(edge - timedelta(seconds=1)), Tier.HOURLY, 1.0),
        (edge, Tier.RAW, 2.0),
    ]


def test_an_hour_moves_on_only_once_all_of_it_is_past_the_retention(store: Store) -> None:
    now = NOW + timedelta(minutes=30)  # the cutoff hour is half past the retention
    inside = now - timedelta(days=14, minutes=10)  # older than 14 days, its hour is not
    record(store, [(inside, 1.0)])
    prune_all(store, now=now)
    assert [p.tier for p in store.prices.price_points(*POOL)] == [Tier.RAW]

    prune_all(store, now=now + timedelta(minutes=30))  # now the whole hour is past
    assert [p.tier for p in store.prices.price_points(*POOL)] == [Tier.HOURLY]


def test_a_second_pass_changes_nothing(store: Store) -> None:
    start = NOW - timedelta(days=16)
    record(store, [(start + timedelta(minutes=10 * i), 1.0 + i % 7) for i in range(6 * 24 * 4)])
    first = prune_all(store)
    rows_after_first = hourly_rows(store)
    raw_after_first = count(store, PriceHistory)

    again = prune_all(store)

    assert sum(b.summarized for b in first) == 6 * 24 * 2  # the two days past 14
    assert sum(b.rows + b.hours for b in again) == 0
    assert hourly_rows(store) == rows_after_first
    assert count(store, PriceHistory) == raw_after_first == 6 * 24 * 2


def test_batches_stay_within_their_bounds_and_finish_the_pass(store: Store) -> None:
    start = NOW - timedelta(days=15)
    zones = [f"use1-az{n}" for n in range(1, 6)]
    for zone in zones:  # 5 pools x 24 hours x 6 points past the retention
        record(
            store,
            [(start + timedelta(minutes=10 * i), 0.1 * (i % 5 + 1)) for i in range(6 * 24)],
            zone=zone,
        )
    batches = prune_all(store, max_rows=50, max_pools=2)

    assert all(b.rows <= 50 for b in batches)
    assert all(b.pools <= 2 for b in batches)
    assert len(batches) >= 5 * 144 // 50
    assert sum(b.summarized for b in batches) == 5 * 144
    assert count(store, PriceHistory) == 0
    assert count(store, PriceHourly) == 5 * 24
    assert {row[5] for row in hourly_rows(store)} == {6}  # no hour split or counted twice


def test_one_hour_bigger_than_a_batch_still_makes_progress(store: Store) -> None:
    hour = NOW - timedelta(days=15)
    record(store, [(hour + timedelta(seconds=10 * i), 1.0) for i in range(300)])
    batches = prune_all(store, max_rows=100)
    assert sum(b.summarized for b in batches) == 300
    assert hourly_rows(store) == [("use1-az1", hour, 1.0, 1.0, 1.0, 300)]


def test_a_crash_inside_a_batch_loses_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = NOW - timedelta(days=20)
    record(store, [(old + timedelta(minutes=10 * i), 1.0 + i) for i in range(6)])

    def crash(*_: object) -> None:
        raise RuntimeError("killed between summarizing and writing")

    monkeypatch.setattr(history_module, "_upsert_hours", crash)
    with pytest.raises(RuntimeError):
        prune_all(store)
    assert count(store, PriceHistory) == 6  # the DELETE was rolled back with the batch
    assert count(store, PriceHourly) == 0

    monkeypatch.undo()
    prune_all(store)
    assert hourly_rows(store) == [("use1-az1", old, 1.0, 3.5, 6.0, 6)]


def test_hourly_rows_and_raw_points_past_the_hourly_retention_go(store: Store) -> None:
    short = Retention(raw=timedelta(days=2), hourly=timedelta(days=10))
    ancient = NOW - timedelta(days=30)
    middle = NOW - timedelta(days=5)
    record(store, [(ancient, 9.0), (middle, 1.0)])
    record(store, [(ancient, 7.0)], zone="use1-az2")  # a pool with nothing newer

    batches = prune_all(store, short)
    assert sum(b.dropped for b in batches) == 2  # past both tiers: no summary written
    assert hourly_rows(store) == [("use1-az1", middle, 1.0, 1.0, 1.0, 1)]

    later = NOW + timedelta(days=6)  # middle's hour is now past the hourly retention
    batches = prune_all(store, short, now=later)
    assert sum(b.expired for b in batches) == 1
    assert count(store, PriceHourly) == 0


def test_a_point_arriving_late_for_a_summarized_hour_is_merged(store: Store) -> None:
    old = NOW - timedelta(days=20)
    record(store, [(old, 1.0), (old + timedelta(minutes=30), 3.0)])
    prune_all(store)
    record(store, [(old + timedelta(minutes=45), 5.0)])  # e.g. a provider's late report
    prune_all(store)
    # held median 2.0 for 2 points, plus 5.0: median of [2, 2, 5]
    assert hourly_rows(store) == [("use1-az1", old, 1.0, 2.0, 5.0, 3)]


# -- the points in effect --------------------------------------------------------------------


def test_points_in_effect_read_across_the_tier_boundary(store: Store) -> None:
    edge = NOW - timedelta(days=14)
    points = [(edge - timedelta(hours=3) + timedelta(minutes=20 * i), float(i)) for i in range(15)]
    record(store, points)  # 9 points in the 3 hours past the edge, 6 after it
    record(store, [(edge + timedelta(minutes=5), 99.0)], market=Market.ON_DEMAND, zone=None)
    prune_all(store)

    got = store.prices.price_points(*POOL)
    assert [(p.at, p.tier, p.usd_per_hour, p.min_usd, p.max_usd, p.points) for p in got] == [
        (edge - timedelta(hours=3), Tier.HOURLY, 1.0, 0.0, 2.0, 3),
        (edge - timedelta(hours=2), Tier.HOURLY, 4.0, 3.0, 5.0, 3),
        (edge - timedelta(hours=1), Tier.HOURLY, 7.0, 6.0, 8.0, 3),
        *((at, Tier.RAW, usd, usd, usd, 1) for at, usd in points[9:]),
    ]

    # A window starting inside a summarized hour: that hour's median is in effect at since.
    since = edge - timedelta(hours=1, minutes=30)
    window = store.prices.price_history(
        *POOL, since=since, until=edge + timedelta(minutes=30), prior=True
    )
    assert window == [
        (edge - timedelta(hours=2), 4.0),
        (edge - timedelta(hours=1), 7.0),
        (edge, 9.0),
        (edge + timedelta(minutes=20), 10.0),
    ]
    # A window starting among raw points: the last raw point before it.
    assert store.prices.price_history(
        *POOL, since=edge + timedelta(minutes=30), until=edge + timedelta(minutes=41), prior=True
    ) == [(edge + timedelta(minutes=20), 10.0), (edge + timedelta(minutes=40), 11.0)]
    # Starting just after the last summarized hour: the hourly median is the prior point.
    assert store.prices.price_history(
        *POOL, since=edge - timedelta(minutes=1), until=edge, prior=True
    ) == [(edge - timedelta(hours=1), 7.0)]
    # Without prior, only what falls inside; other pools never leak in.
    assert store.prices.price_history(*POOL, since=since, until=edge) == [
        (edge - timedelta(hours=1), 7.0)
    ]


def test_a_point_exactly_at_since_is_in_effect_and_the_older_one_is_the_prior(
    store: Store,
) -> None:
    record(store, [(NOW - timedelta(hours=2), 1.0), (NOW - timedelta(hours=1), 2.0)])
    got = store.prices.price_points(*POOL, since=NOW - timedelta(hours=1), prior=True)
    assert [(p.at, p.usd_per_hour) for p in got] == [
        (NOW - timedelta(hours=2), 1.0),
        (NOW - timedelta(hours=1), 2.0),
    ]
    assert store.prices.price_points(*POOL, since=NOW - timedelta(days=9), prior=True)[0].at == (
        NOW - timedelta(hours=2)
    )  # nothing before since: no prior point


def test_limit_keeps_the_oldest_points_of_the_range(store: Store) -> None:
    edge = NOW - timedelta(days=14)
    record(store, [(edge - timedelta(hours=2), 1.0), (edge - timedelta(hours=1), 2.0)])
    record(store, [(edge + timedelta(minutes=m), 3.0) for m in (0, 10, 20)])
    prune_all(store)
    got = store.prices.price_points(*POOL, since=edge - timedelta(minutes=90), prior=True, limit=2)
    assert [(p.at, p.tier) for p in got] == [
        (edge - timedelta(hours=2), Tier.HOURLY),  # the prior
        (edge - timedelta(hours=1), Tier.HOURLY),
        (edge, Tier.RAW),
    ]
    with pytest.raises(ValueError, match="limit"):
        store.prices.price_points(*POOL, limit=0)
