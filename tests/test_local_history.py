"""The local cloud's simulated price history, written rather than waited for: a pure function
of (seed, pool, time), so a fresh daemon (and `gpuopt local history`) can write the days
before its first poll, one point per pool and hour, equal to what a poll then would have
read (providers/local/history.py)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from optimizer.clock import ManualClock
from optimizer.model import Market
from optimizer.store import Store
from providers.local import LocalCloud
from providers.local.history import backfill, points
from tests.helpers import make_config, run_gpuopt, running, wait_until

NOW = datetime(2026, 3, 14, 12, 30, tzinfo=UTC)
H = timedelta(hours=1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'gpuopt.db'}") as s:
        s.create_all()
        yield s


@pytest.fixture
def cloud(tmp_path: Path) -> LocalCloud:
    return LocalCloud(tmp_path / "local-cloud")  # never started: its prices need no process


def counts(cloud: LocalCloud) -> tuple[int, int]:
    offers = cloud.offers_at(NOW.timestamp())
    spot = sum(o.market is Market.SPOT for o in offers)
    return len(offers) - spot, spot


def test_a_day_is_one_point_per_pool_and_hour_equal_to_what_a_poll_read(
    store: Store, cloud: LocalCloud
) -> None:
    done = backfill(cloud, store.prices.record_history, None, now=NOW, days=1)
    on_demand, spot = counts(cloud)
    hours = 25  # 12:00 the day before to 12:00 today, the last before NOW (12:30)
    # in two batches (24 h each at most), each with the on-demand list prices at its start
    assert done.points == 2 * on_demand + spot * hours
    assert (done.start, done.end) == (NOW - timedelta(days=1) - 30 * timedelta(minutes=1), NOW)
    # Every hour's spot price is the one the local cloud quotes at that time (a function of
    # the time), labelled simulated; the on-demand list price once, at the start.
    sample = [o for o in cloud.offers_at(NOW.timestamp()) if o.market is Market.SPOT][::97]
    for o in sample:
        kept = store.prices.price_history(*o.pool)
        assert len(kept) == hours
        for at, usd in kept:
            then = next(x for x in cloud.offers_at(at.timestamp()) if x.pool == o.pool)
            assert usd == then.usd_per_hour
    first = min(at for at, _ in store.prices.price_history(*sample[0].pool))
    assert store.prices.earliest_observation("local") == first


def test_only_what_is_before_the_first_observation_is_written(
    store: Store, cloud: LocalCloud
) -> None:
    earliest = NOW - 3 * H
    done = backfill(cloud, store.prices.record_history, earliest, now=NOW, days=1)
    _, spot = counts(cloud)
    assert done.end == earliest and done.points > 0
    assert max(at for p, _, at, _ in points(cloud, done.start, done.end)) < earliest
    again = backfill(
        cloud, store.prices.record_history, store.prices.earliest_observation("local"),
        now=NOW, days=1,
    )  # fmt: skip
    assert again.points == 0 and "nothing to add" in again.summary()
    assert backfill(cloud, store.prices.record_history, None, now=NOW, days=0).points == 0
    assert spot > 0


def test_a_stop_leaves_a_history_with_no_gap_only_a_later_start(
    store: Store, cloud: LocalCloud
) -> None:
    asked = itertools.count()
    done = backfill(
        cloud, store.prices.record_history, None, now=NOW, days=3,
        cancelled=lambda: next(asked) >= 1,  # stop after the first two batches
    )  # fmt: skip
    assert done.end == NOW and NOW - timedelta(days=3) < done.start < NOW
    pool = next(o.pool for o in cloud.offers_at(NOW.timestamp()) if o.market is Market.SPOT)
    times = [at for at, _ in store.prices.price_history(*pool)]
    assert times[0] == done.start and all(b - a == H for a, b in itertools.pairwise(times))


def test_a_fresh_daemon_writes_its_history_once_as_the_leader(tmp_path: Path) -> None:
    cloud = LocalCloud(tmp_path / "data" / "local-cloud")
    config = make_config(tmp_path / "data", providers={"local": {"history_days": 1}})
    with running(config, clock=ManualClock(NOW), sources={"local": cloud}) as daemon:
        wait_until(daemon.local_history.done.is_set, 60, "the history")
        store = daemon.store
        earliest = store.prices.earliest_observation("local")
        assert earliest == NOW - timedelta(days=1) - 30 * timedelta(minutes=1)
        pool = next(o.pool for o in cloud.offers_at(NOW.timestamp()) if o.market is Market.SPOT)
        assert len(store.prices.price_history(*pool, until=NOW)) == 25


def test_gpuopt_local_history_writes_the_days_asked(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    missing = run_gpuopt(data, "local", "history", "--days", "1")
    assert missing.returncode == 2 and "no store yet" in missing.stderr
    with Store(f"sqlite:///{data / 'gpuopt.db'}") as fresh:
        fresh.create_all()
    done = run_gpuopt(data, "local", "history", "--days", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("local cloud: ") and "simulated price points over" in done.stdout
    with Store(f"sqlite:///{data / 'gpuopt.db'}") as store:
        cloud = LocalCloud(data / "local-cloud")
        pool = next(o.pool for o in cloud.offers_at(NOW.timestamp()) if o.market is Market.SPOT)
        times = [at for at, _ in store.prices.price_history(*pool)]
    # A day back from now, hourly: 24 or 25 points, whatever the date the test runs on.
    assert len(times) in (24, 25) and times[-1] - times[0] in (23 * H, 24 * H)
    again = run_gpuopt(data, "local", "history", "--days", "1")
    assert "nothing to add" in again.stdout
