"""Backtests over the store's own history, across its two tiers: the raw points it keeps and
the hourly summaries its retention folds older points into (docs/backtest.md, "The history";
docs/costs.md, "Retention"). Checked to the cent against sums done by hand, on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.jobs.history import read_history, store_history, write_history
from optimizer.model import Market, Offer
from optimizer.store import Retention, Store, Tier, bulk
from policies.backtest import History, replay, seconds
from policies.schema import Policy
from tests.helpers import make_offer

T0 = datetime(2026, 3, 2, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
# Raw points kept 2 hours: at NOW the hours starting at T0 and T0 + 1 h are folded.
RETENTION = Retention(raw=2 * H, hourly=timedelta(days=400))
NOW = T0 + 4 * H + 10 * M
CAP = Policy.model_validate(
    {
        "apiVersion": "gpuopt/v1",
        "kind": "Policy",
        "name": "bt",
        "markets": ["spot"],
        "bid": {"max_usd_per_hour": 3.0},
    }
)


def point(zone: str | None, at: timedelta, usd: float, market: Market = Market.SPOT) -> Offer:
    return make_offer(zone=zone, market=market, usd_per_hour=usd, observed_at=T0 + at)


A, B = "use1-az1", "use1-az2"
# Hours 0 and 1 polled every 20 minutes, then hourly. Folded, pool A's hour 0 is a median of
# 2.00 (min 1.00, max 6.00) and its hour 1 a median of 3.50, over the cap; B's are 2.50 and
# 2.60. The on-demand price of the type, 10.00, is listed once, at T0.
POLLS = [
    [point(A, 0 * M, 1.0), point(B, 0 * M, 2.5), point(None, 0 * M, 10.0, Market.ON_DEMAND)],
    [point(A, 20 * M, 2.0), point(B, 20 * M, 2.5)],
    [point(A, 40 * M, 6.0), point(B, 40 * M, 2.5)],
    [point(A, 60 * M, 3.5), point(B, 60 * M, 2.5)],
    [point(A, 80 * M, 3.5), point(B, 80 * M, 2.8)],
    [point(A, 100 * M, 1.0), point(B, 100 * M, 2.6)],
    [point(A, 2 * H, 1.5), point(B, 2 * H, 2.6)],
    [point(A, 3 * H, 1.5), point(B, 3 * H, 5.0)],
]


def folded(store: Store) -> None:
    """The polls recorded as the daemon records them, then its retention pass run through."""
    for poll in POLLS:
        store.prices.record_offers(poll)
    after = None
    while not (batch := store.prices.prune_history(RETENTION, now=NOW, after=after)).done:
        after = batch.after
    assert batch.summarized == 0 or batch.hours > 0


def test_a_store_backtest_reads_the_hours_the_retention_folded(store: Store) -> None:
    folded(store)
    tiers = [p.tier for p in store.prices.price_points("aws", "us-east-1", A, "g5.xlarge", "spot")]
    assert tiers == [Tier.HOURLY, Tier.HOURLY, Tier.RAW, Tier.RAW]  # the boundary is crossed

    history = store_history(store)
    ran = replay(CAP, history, until=T0 + 4 * H)
    # T0: A at its median 2.00. T0+1h: A's median 3.50 crosses the cap, to B at 2.60.
    # T0+2h: B at 2.60 stays a candidate. T0+3h: B at 5.00 crosses, back to A at 1.50.
    assert [s.pool.zone if s.pool else None for s in ran.steps] == [A, B, B, A]
    assert [s.usd_per_hour for s in ran.steps] == [2.0, 2.6, 2.6, 1.5]
    assert round(ran.cost_usd, 2) == 8.70  # 2.00 + 2.60 + 2.60 + 1.50
    assert round(ran.savings_usd, 2) == 31.30  # the on-demand 10.00 for 4 h, from its hour row
    assert (ran.snapshots, ran.moves, ran.cap_crossings) == (4, 2, 2)

    # Each pool's points are the ledger's points in effect, both tiers.
    for row, offer in enumerate(history.pools.offers):
        mine = history.pool == row
        ledger = store.prices.price_history(*offer.pool)
        assert list(
            zip(history.at[mine].tolist(), history.usd_per_hour[mine].tolist(), strict=True)
        ) == [(seconds(at), usd) for at, usd in ledger]

    window = store_history(store, since=T0 + H, until=T0 + 2 * H)
    assert sorted(set(window.at.tolist())) == [seconds(T0 + H), seconds(T0 + 2 * H)]
    assert len(window.pools) == 2  # the on-demand pool has no point in the window


def test_a_raw_point_at_an_hours_start_wins_over_its_median(store: Store) -> None:
    folded(store)
    store.prices.record_offers([point(A, 1 * H, 2.0)])  # arrives late, for a folded hour
    ran = replay(CAP, store_history(store), until=T0 + 4 * H)
    # A's 2.00 is in effect at T0+1h (the ledger orders a raw point after an hour's row of
    # the same instant): the job stays on A, 2.00 + 2.00 + 1.50 + 1.50.
    assert [s.pool.zone if s.pool else None for s in ran.steps] == [A, A, A, A]
    assert round(ran.cost_usd, 2) == 7.00 and (ran.moves, ran.cap_crossings) == (0, 0)


def test_an_hour_folded_while_the_store_is_read_is_seen_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    for poll in POLLS:
        store.prices.record_offers(poll)
    read_tier = bulk._tier

    def fold_between_the_tiers(conn: Any, tier: Any, *args: Any) -> Any:
        found = read_tier(conn, tier, *args)
        if tier.name == "price_hourly":  # read first: none yet. Now the retention runs.
            after = None
            while not (batch := store.prices.prune_history(RETENTION, now=NOW, after=after)).done:
                after = batch.after
            assert batch.summarized or batch.hours or after is not None
        return found

    monkeypatch.setattr(bulk, "_tier", fold_between_the_tiers)
    ran = replay(CAP, store_history(store), until=T0 + 4 * H)
    # The raw points of hours 0 and 1, as they were when the read began, 20 minutes each:
    # A at 1.00 and 2.00; at T0+40m A's 6.00 crosses, B at 2.50, 2.50, 2.80, 2.60, and 2.60
    # for the hour from T0+2h; at T0+3h B's 5.00 crosses, back to A at 1.50.
    assert round(ran.cost_usd, 2) == round((1.0 + 2.0 + 2.5 + 2.5 + 2.8 + 2.6) / 3 + 2.6 + 1.5, 2)
    assert (ran.snapshots, ran.moves, ran.cap_crossings) == (8, 2, 2)
    assert store.prices.price_points("aws", "us-east-1", A, "g5.xlarge", "spot")[0].tier is (
        Tier.HOURLY
    )  # the fold did happen, in the meantime


def test_points_of_one_instant_count_in_the_order_they_were_written(store: Store) -> None:
    store.prices.record_offers([point(A, 0 * M, 2.0), point(B, 0 * M, 2.5)])
    store.prices.record_offers([point(A, 0 * M, 1.0)])  # the same instant, written later
    with store.engine.begin() as conn:
        # On PostgreSQL an update writes the row's new version after the others, so a scan
        # returns it last: the first-written point must still count first.
        conn.execute(text("UPDATE price_history SET source = 'again' WHERE usd_per_hour = 2.0"))
    ran = replay(CAP, store_history(store), until=T0 + H)
    assert ran.steps[0].pool is not None and ran.steps[0].pool.zone == A
    assert ran.cost_usd == 1.0


def test_points_read_in_any_order_are_put_in_time_then_write_order() -> None:
    # As a PostgreSQL scan may return them: rows updated or written into freed space come
    # out of id order. (pool, at, usd, id)
    rows = [(0, 200, 1.0, 7), (0, 100, 2.0, 9), (1, 100, 3.0, 2), (0, 100, 4.0, 3)]
    found = bulk.in_time_order(np.array(rows, dtype=bulk.POINT))
    assert found["seq"].tolist() == [2, 3, 9, 7]  # at 100: ids 2, 3, 9; then at 200
    assert bulk.in_time_order(found) is found  # already in order: kept as it is


def test_an_export_of_both_tiers_replays_alike(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folded(store)
    monkeypatch.setattr(bulk, "BATCH_ROWS", 2)  # read in many batches, as a month is
    monkeypatch.setattr(bulk, "COPY_BYTES", 64)
    exported = tmp_path / "history.arrow"
    assert write_history(store_history(store), exported) == 2 + 2 + 2 + 2 + 1  # hours, points
    again: History = read_history(exported)
    ran = replay(CAP, again, until=T0 + 4 * H)
    assert round(ran.cost_usd, 2) == 8.70 and (ran.moves, ran.cap_crossings) == (2, 2)


def test_prices_export_and_backtest_from_the_store_see_both_tiers(tmp_path: Path) -> None:
    database = tmp_path / "gpuopt.db"
    with Store(f"sqlite:///{database}") as db:
        db.create_all()
        folded(db)
    config = tmp_path / "gpuopt.yaml"
    config.write_text(f"database_url: sqlite:///{database}\n")
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(json.dumps(CAP.model_dump(mode="json", exclude_unset=True)))
    exported = tmp_path / "h.csv"
    run = CliRunner().invoke(
        app, ["prices", "export", "--since", "2026-03-01", "-o", str(exported), "-c", str(config)]
    )
    assert run.exit_code == 0, run.output
    assert "wrote 9 price points (5 of them hourly medians) of 3 pools" in run.output
    for source in (["--history", str(exported)], ["--from-store", "-c", str(config)]):
        done = CliRunner().invoke(
            app, ["backtest", str(policy_file), *source, "--until", "2026-03-02T04:00Z", "--json"]
        )
        assert done.exit_code == 0, done.output
        out = json.loads(done.output)
        assert (out["cost_usd"], out["savings_usd"], out["moves"]) == (8.7, 31.3, 2)
