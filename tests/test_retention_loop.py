"""The retention loop on an injected clock: it ages price history as time passes, ends a
pass early when the daemon stops or leadership is lost (the next pass goes on), and the
daemon schedules it from a validated `prices.retention` config."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from optimizer.clock import ManualClock
from optimizer.daemon.config import ConfigError, load_config
from optimizer.daemon.loops.retention import RetentionLoop
from optimizer.store import PruneBatch, Retention, Store, Tier
from optimizer.store.tables import PriceHistory, PriceHourly
from tests.helpers import make_config, make_offer, running, wait_until

pytestmark = pytest.mark.usefixtures("daemon_env")

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
RETENTION = Retention(raw=timedelta(days=14), hourly=timedelta(days=400))


def count(store: Store, table: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def seed(store: Store, start: datetime, days: int, zones: int = 3) -> int:
    """Points every 10 minutes for `days` days from `start` in `zones` pools."""
    offers = [
        make_offer(
            zone=f"use1-az{z}",
            observed_at=start + timedelta(minutes=10 * i),
            usd_per_hour=0.3 + 0.01 * (i % 6),
        )
        for z in range(1, zones + 1)
        for i in range(days * 144)
    ]
    return store.prices.record_offers(offers)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'gpuopt.db'}") as store:
        store.create_all()
        yield store


def test_each_pass_ages_what_the_clock_says_is_past_the_retention(db: Store) -> None:
    clock = ManualClock(NOW)
    seed(db, NOW - timedelta(days=16), days=16)
    loop = RetentionLoop(db, clock, RETENTION, batch_rows=500)

    first = loop.run_once()
    assert first.complete and first.batches > 1  # 3 x 288 points in batches of 500
    assert first.summarized == 3 * 2 * 144  # the two days past 14 days
    assert count(db, PriceHourly) == 3 * 48

    assert loop.run_once().summarized == 0  # the same time: nothing more to do

    clock.advance(days=1)
    later = loop.run_once()
    assert later.summarized == 3 * 144 and later.hours == 3 * 24
    assert count(db, PriceHistory) == 3 * 13 * 144
    points = db.prices.price_points(*make_offer(zone="use1-az2").pool)
    assert [p.tier for p in points[:72]] == [Tier.HOURLY] * 72
    assert points[72].tier is Tier.RAW and points[72].at == NOW - timedelta(days=13)


def test_losing_leadership_ends_the_pass_and_the_next_one_finishes(db: Store) -> None:
    seed(db, NOW - timedelta(days=15), days=1, zones=4)
    answers = iter([True, False])
    loop = RetentionLoop(
        db, ManualClock(NOW), RETENTION, batch_rows=144, leading=lambda: next(answers, True)
    )
    cut = loop.run_once()
    assert (cut.batches, cut.complete, cut.summarized) == (1, False, 144)
    rest = loop.run_once()
    assert rest.complete and rest.summarized == 3 * 144
    assert count(db, PriceHistory) == 0


def test_stop_ends_a_pass_after_its_current_batch(
    db: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(db, NOW - timedelta(days=15), days=1, zones=4)
    loop = RetentionLoop(db, ManualClock(NOW), RETENTION, batch_rows=144)
    prune = db.prices.prune_history

    def stopped_during(*args: Any, **kwargs: Any) -> PruneBatch:
        batch = prune(*args, **kwargs)
        loop.stop()  # SIGTERM arrives while this batch runs
        return batch

    monkeypatch.setattr(db.prices, "prune_history", stopped_during)
    report = loop.run_once()
    assert (report.batches, report.complete) == (1, False)
    assert count(db, PriceHistory) == 3 * 144


def test_the_daemon_runs_retention_as_the_leader_with_its_config(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = make_config(
        data, prices={"retention": {"raw_days": 2, "hourly_days": 5, "batch_rows": 100}}
    )
    with Store(config.effective_database_url) as store:
        store.create_all()
        seed(store, NOW - timedelta(days=4), days=1, zones=2)  # 2 to 3 days old

    with running(config, clock=ManualClock(NOW)) as daemon:
        assert "retention" in daemon.scheduler.names
        wait_until(
            lambda: count(daemon.store, PriceHistory) == 0,
            what="the retention loop's first pass",
        )
        assert count(daemon.store, PriceHourly) == 2 * 24


def test_retention_config_is_validated_with_located_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("prices:\n  retention:\n    raw_days: 30\n    hourly_days: 20\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:4:18: prices.retention.hourly_days: must be more than "
        "prices.retention.raw_days (30)"
    ]
    path.write_text("prices: {retention: {raw_days: 0, batch_rows: 10}}\nloops: {retention_s: 0}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:1:32: prices.retention.raw_days: must be > 0",
        f"{path}:1:47: prices.retention.batch_rows: must be >= 100",
        f"{path}:2:22: loops.retention_s: must be > 0",
    ]
    path.write_text("prices: {retention: {raw_days: 7}}\n")
    monkeypatch.setenv("GPUOPT_PRICES__RETENTION__HOURLY_DAYS", "90")
    config = load_config(path)
    assert config.prices.retention.retention() == Retention(
        raw=timedelta(days=7), hourly=timedelta(days=90)
    )
    assert config.loops.retention_s == 3600
