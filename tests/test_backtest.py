"""Backtests and the bid-cap advisor, checked to the cent against sums done by hand
(docs/backtest.md has the semantics)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.csv as pcsv
import pytest
from typer.testing import CliRunner

from optimizer.catalog import write_catalog
from optimizer.cli import app
from optimizer.jobs.backtest import Migrations
from optimizer.jobs.history import history_table, read_history, store_history, write_history
from optimizer.model import Market, Offer
from optimizer.store import Store
from policies.backtest import History, advise_bid, replay
from policies.schema import Policy
from tests.helpers import make_offer

T0 = datetime(2026, 3, 2, tzinfo=UTC)
H = timedelta(hours=1)


def point(zone: str | None, hour: float, usd: float, market: Market = Market.SPOT) -> Offer:
    return make_offer(
        provider="aws",
        region="us-east-1",
        zone=zone,
        instance_type="g5.xlarge",
        gpu_model="A10G",
        gpu_count=1,
        gpu_memory_gib=24.0,
        interconnect="none",
        market=market,
        usd_per_hour=usd,
        observed_at=T0 + hour * H,
    )


def policy(**sections: Any) -> Policy:
    return Policy.model_validate(
        {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "bt", "markets": ["spot"], **sections}
    )


# Two spot pools and the on-demand price of their type (rejected by the market rule, still
# the baseline). Hour 1: A passes the cap. Hour 3: B does too, and nothing is left.
POINTS = [
    point("use1-az1", 0, 2.0),
    point("use1-az2", 0, 2.5),
    point(None, 0, 10.0, Market.ON_DEMAND),
    point("use1-az1", 1, 3.5),
    point("use1-az2", 1, 2.5),
    point("use1-az1", 2, 1.0),
    point("use1-az2", 2, 2.6),
    point("use1-az1", 3, 4.0),
    point("use1-az2", 3, 5.0),
]


def test_cap_crossings_moves_and_a_gap_to_the_cent() -> None:
    ran = replay(
        policy(bid={"max_usd_per_hour": 3.0}), History.from_offers(POINTS), until=T0 + 4 * H
    )
    # A 1 h at 2.00, B 1 h at 2.50 (A crossed), B stays 1 h at 2.60 though A is cheaper,
    # then B crosses too: 1 h with no candidate.
    assert round(ran.cost_usd, 2) == 7.10
    assert round(ran.on_demand_usd, 2) == 30.00  # 3 h at the on-demand 10.00
    assert round(ran.savings_usd, 2) == 22.90
    assert (ran.moves, ran.cap_crossings) == (1, 2)
    assert ran.hours_without_candidate == pytest.approx(1.0)
    assert ran.hours == pytest.approx(4.0)
    assert [s.pool.zone if s.pool else None for s in ran.steps] == [
        "use1-az1",
        "use1-az2",
        "use1-az2",
        None,
    ]


def test_default_until_is_the_last_snapshot() -> None:
    ran = replay(policy(bid={"max_usd_per_hour": 3.0}), History.from_offers(POINTS))
    assert round(ran.cost_usd, 2) == 7.10 and ran.hours_without_candidate == 0
    assert ran.end == T0 + 3 * H


def test_a_pool_that_goes_stale_disappears() -> None:
    # B is observed once, cheapest; with a 1.5 h price age it is gone at hour 2.
    points = [
        point("use1-az2", 0, 1.0),
        point("use1-az1", 0, 2.0),
        point("use1-az1", 1, 2.0),
        point("use1-az1", 2, 2.2),
    ]
    ran = replay(policy(max_price_age_hours=1.5), History.from_offers(points), until=T0 + 3 * H)
    assert [s.pool.zone if s.pool else None for s in ran.steps] == [
        "use1-az2",
        "use1-az2",
        "use1-az1",
    ]
    assert round(ran.cost_usd, 2) == 4.20  # 1.00 + 1.00 + 2.20
    assert ran.moves == 1 and ran.cap_crossings == 0
    assert ran.hours_without_baseline == pytest.approx(3.0)  # no on-demand price in the file


def test_since_starts_at_its_snapshot_with_the_prices_then_in_effect() -> None:
    ran = replay(
        policy(bid={"max_usd_per_hour": 3.0}),
        History.from_offers(POINTS),
        since=T0 + 2 * H,
        until=T0 + 4 * H,
    )
    # Hour 2: A at 1.00 is best (B's earlier point does not bind the new start).
    assert round(ran.cost_usd, 2) == 1.00
    assert ran.hours_without_candidate == pytest.approx(1.0)
    assert ran.cap_crossings == 1 and ran.moves == 0


def test_advise_bid_finds_the_lowest_cap_for_the_target() -> None:
    history = History.from_offers(POINTS)
    # Cheapest spot per snapshot: 2.0, 2.5, 1.0, 4.0. Three of four (0.75) need 2.5.
    advice = advise_bid(policy(bid={"max_usd_per_hour": 3.0}), history, 0.75)
    assert advice.usd_per_hour is not None
    assert advice.usd_per_hour.bid == {"max_usd_per_hour": 2.5}
    assert advice.usd_per_hour.availability == pytest.approx(0.75)
    assert advice.current.availability == pytest.approx(0.75)
    # Under 2.5: A 2.00, B 2.50 (A crossed), A 1.00 (B still at 2.6 > 2.5), hour 3 none.
    assert advice.usd_per_hour.backtest is not None
    assert round(advice.usd_per_hour.backtest.cost_usd, 2) == 5.50
    # Spot over on-demand per snapshot: 0.20, 0.25, 0.10, 0.40.
    assert advice.fraction_of_on_demand is not None
    assert advice.fraction_of_on_demand.bid == {"max_fraction_of_on_demand": 0.25}
    full = advise_bid(policy(), history, 1.0)
    assert full.usd_per_hour is not None and full.usd_per_hour.bid == {"max_usd_per_hour": 4.0}


def test_backtest_command_reads_a_catalog_history(tmp_path: Path) -> None:
    history = tmp_path / "history.csv"
    with history.open("w", encoding="utf-8", newline="") as stream:
        write_catalog(POINTS, stream, comments=["hand-made"])
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: bt\nmarkets: [spot]\n"
        "bid: {max_usd_per_hour: 3}\n"
    )
    run = CliRunner().invoke(
        app,
        [
            "backtest",
            str(policy_file),
            "--history",
            str(history),
            "--until",
            "2026-03-02T04:00Z",
            "--json",
        ],
    )
    assert run.exit_code == 0, run.output
    out = json.loads(run.output)
    assert (out["cost_usd"], out["savings_usd"], out["moves"]) == (7.1, 22.9, 1)
    assert len(out["series"]) == 4 and out["series"][1]["pool"].endswith("use1-az2/g5.xlarge/spot")
    advice = CliRunner().invoke(
        app,
        [
            "advise-bid",
            str(policy_file),
            "--history",
            str(history),
            "--target-availability",
            "0.75",
            "--json",
        ],
    )
    assert advice.exit_code == 0, advice.output
    assert json.loads(advice.output)["max_usd_per_hour"]["bid"] == {"max_usd_per_hour": 2.5}


def test_a_bad_history_names_file_line_and_field(tmp_path: Path) -> None:
    history = tmp_path / "bad.csv"
    with history.open("w", encoding="utf-8", newline="") as stream:
        write_catalog(POINTS[:2], stream)
    text = history.read_text().replace(",2.5,", ",cheap,")
    history.write_text(text)
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("apiVersion: gpuopt/v1\nkind: Policy\nname: bt\n")
    run = CliRunner().invoke(app, ["backtest", str(policy_file), "--history", str(history)])
    assert run.exit_code == 2
    assert "bad.csv:3:" in run.output and "usd_per_hour" in run.output


def test_each_snapshot_runs_under_the_schedule_window_in_force() -> None:
    windowed = policy(
        bid={"max_usd_per_hour": 3.0},
        schedule={
            "timezone": "UTC",
            "windows": [
                {"name": "tight", "hours": "02:00-03:00", "bid": {"max_usd_per_hour": 2.0}}
            ],
        },
    )
    ran = replay(windowed, History.from_offers(POINTS), until=T0 + 4 * H)
    # Hour 2 under the window's 2.00 cap: B at 2.60 crosses it and the job moves to A at 1.00;
    # hour 3, back under 3.00: A at 4.00 crosses, B at 5.00 too, nothing left.
    assert [s.pool.zone if s.pool else None for s in ran.steps] == [
        "use1-az1",
        "use1-az2",
        "use1-az1",
        None,
    ]
    assert round(ran.cost_usd, 2) == 5.50
    assert (ran.moves, ran.cap_crossings) == (2, 3)


def test_migration_moves_to_a_pool_cheaper_for_long_enough() -> None:
    points = [
        point("use1-az1", 0, 2.0),
        point("use1-az2", 0, 3.0),
        point("use1-az1", 1, 2.0),
        point("use1-az2", 1, 1.0),  # 50% cheaper, but only for the last hour's second half
        point("use1-az1", 2, 2.0),
        point("use1-az2", 2, 1.0),  # cheap at every point of the last hour: it moves
    ]
    history = History.from_offers(points)
    migrating = policy(migration={"enabled": True, "min_savings": 0.25, "min_stable": 3600})
    ran = replay(migrating, history, until=T0 + 3 * H, mover=Migrations(migrating, history))
    # A 2.00 + A 2.00 + B 1.00: at hour 2 the saving (2.00 - 1.00) x 2 h run so far beats a
    # 10-minute restart at 1.00.
    assert [s.pool.zone if s.pool else None for s in ran.steps] == [
        "use1-az1",
        "use1-az1",
        "use1-az2",
    ]
    assert round(ran.cost_usd, 2) == 5.00
    assert (ran.moves, ran.migrations) == (1, 1)
    stays = replay(migrating, history, until=T0 + 3 * H)  # without the pass: no reason to move
    assert round(stays.cost_usd, 2) == 6.00 and stays.moves == 0


@pytest.mark.parametrize("suffix", [".csv", ".arrow", ".parquet"])
def test_store_history_round_trips_through_every_file_format(
    store: Store, tmp_path: Path, suffix: str
) -> None:
    for p in POINTS:  # each poll's offers, as the daemon records them
        store.prices.record_offers([p])
    found = store_history(store, since=T0 + H)
    assert len(found.at) == 6 and len(found.pools) == 2  # the on-demand point is older
    written = tmp_path / f"history{suffix}"
    assert write_history(store_history(store), written, comment="export") == len(POINTS)
    again = read_history(written)
    ran = replay(policy(bid={"max_usd_per_hour": 3.0}), again, until=T0 + 4 * H)
    assert round(ran.cost_usd, 2) == 7.10 and round(ran.savings_usd, 2) == 22.90
    assert {o.pool for o in again.pools.offers} == {p.pool for p in POINTS}


@pytest.mark.parametrize("suffix", [".csv", ".arrow", ".parquet"])
def test_a_history_of_pools_without_zones_reads_in_every_format(
    tmp_path: Path, suffix: str
) -> None:
    # Priced per region (as the local cloud lists on-demand): the export leaves the zone
    # column out, and the pools are told apart by region.
    points = [
        make_offer(zone=None, region=region, usd_per_hour=usd, observed_at=T0 + hour * H)
        for hour, prices in enumerate([(2.0, 2.5), (3.5, 2.5)])
        for region, usd in zip(("us-east-1", "us-west-2"), prices, strict=True)
    ]
    written = tmp_path / f"history{suffix}"
    table = history_table(History.from_offers(points))
    assert "zone" not in table.column_names
    if suffix == ".csv":  # the catalog's own writer always writes a zone column
        pcsv.write_csv(table, written)
    else:
        write_history(History.from_offers(points), written)
    again = read_history(written)
    assert {o.region for o in again.pools.offers} == {"us-east-1", "us-west-2"}
    ran = replay(policy(bid={"max_usd_per_hour": 3.0}), again, until=T0 + 2 * H)
    assert round(ran.cost_usd, 2) == 4.50 and ran.moves == 1  # 2.00 east, then 2.50 west


def test_points_in_any_order_replay_alike() -> None:
    shuffled = POINTS[::-1]  # newest first: the history's rows need not be in time order
    ran = replay(
        policy(bid={"max_usd_per_hour": 3.0}), History.from_offers(shuffled), until=T0 + 4 * H
    )
    assert round(ran.cost_usd, 2) == 7.10 and (ran.moves, ran.cap_crossings) == (1, 2)


def test_prices_export_and_backtest_from_the_store_through_the_cli(tmp_path: Path) -> None:
    database = tmp_path / "gpuopt.db"
    with Store(f"sqlite:///{database}") as db:
        db.create_all()
        for p in POINTS:
            db.prices.record_offers([p])
    config = tmp_path / "gpuopt.yaml"
    config.write_text(f"database_url: sqlite:///{database}\n")
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: bt\nmarkets: [spot]\n"
        "bid: {max_usd_per_hour: 3}\n"
    )
    exported = tmp_path / "h.arrow"
    run = CliRunner().invoke(
        app, ["prices", "export", "--since", "2026-03-01", "-o", str(exported), "-c", str(config)]
    )
    assert run.exit_code == 0, run.output
    assert "wrote 9 price points of 3 pools" in run.output
    for source in (["--history", str(exported)], ["--from-store", "-c", str(config)]):
        done = CliRunner().invoke(
            app,
            ["backtest", str(policy_file), *source, "--until", "2026-03-02T04:00Z", "--json"],
        )
        assert done.exit_code == 0, done.output
        out = json.loads(done.output)
        assert (out["cost_usd"], out["cap_crossings"], out["hours_without_candidate"]) == (
            7.1,
            2,
            1.0,
        )


def test_advise_bid_replays_the_migration_block_as_backtest_does(tmp_path: Path) -> None:
    """The same policy and history cost the same in `backtest` and in `advise-bid`'s row for
    the caps as written: the advisor keeps the policy's migration block (it once dropped it)."""
    points = [
        point("use1-az1", 0, 2.0),
        point("use1-az2", 0, 3.0),
        point("use1-az1", 1, 2.0),
        point("use1-az2", 1, 1.0),
        point("use1-az1", 2, 2.0),
        point("use1-az2", 2, 1.0),
    ]
    history_file = tmp_path / "history.csv"
    with history_file.open("w") as stream:
        write_catalog(points, stream)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: bt\nmarkets: [spot]\n"
        "migration: {enabled: true, min_savings: 0.25, min_stable: 3600}\n"
    )
    until = ["--until", (T0 + 3 * H).isoformat()]
    runner = CliRunner()
    ran = runner.invoke(
        app, ["backtest", str(policy_file), "--history", str(history_file), "--json", *until]
    )
    advised = runner.invoke(
        app, ["advise-bid", str(policy_file), "--history", str(history_file), "--json", *until]
    )
    assert ran.exit_code == 0 and advised.exit_code == 0, ran.output + advised.output
    cost = json.loads(ran.output)["cost_usd"]
    assert round(cost, 2) == 5.00  # with the move (6.00 without: the test above)
    assert json.loads(advised.output)["current"]["cost_usd"] == round(cost, 2)


def test_advise_bid_says_why_no_value_reaches_the_target_and_when_the_history_is_short() -> None:
    # 40 GiB per GPU: the A10G's 24 GiB never passes, whatever the cap.
    big = policy(workload={"type": "training", "gpus": 1, "gpu_memory_gib": 40})
    out = advise_bid(big, History.from_offers(POINTS), 0.5, until=T0 + 4 * H).to_dict()
    assert out["max_usd_per_hour"] is None and out["max_fraction_of_on_demand"] is None
    said = "at any price, the policy's other rules left a candidate in only 0.0% of snapshots"
    assert out["why_none"] == {"max_usd_per_hour": said, "max_fraction_of_on_demand": said}
    # Three hours of points: too short to judge, and said so.
    assert any("too short to judge" in w for w in out["warnings"])
    reachable = advise_bid(policy(), History.from_offers(POINTS[:3]), 0.5, until=T0 + H)
    assert reachable.to_dict()["why_none"].get("max_usd_per_hour") is None
    assert reachable.usd_per_hour is not None
    shy = advise_bid(policy(), History.from_offers(POINTS[:3]), 0.95, until=T0 + H).to_dict()
    assert any("cannot resolve a target of 95.0%" in w for w in shy["warnings"])


@pytest.mark.parametrize(
    ("markets", "zone"), [(["owned", "spot"], "fra-lab"), (["spot", "owned"], "use1-az1")]
)
def test_owning_first_places_the_job_on_an_owned_pool_whatever_the_prices(
    markets: list[str], zone: str
) -> None:
    """`markets: [owned, spot]` ranks an owned offer ahead of every cloud offer, as the
    engine does; listed later, owned offers rank by price with the rest."""
    owned = make_offer(
        provider="ssh",
        region="us-east-1",
        zone="fra-lab",
        instance_type="owned-1xA10G",
        gpu_model="A10G",
        gpu_count=1,
        gpu_memory_gib=24.0,
        interconnect="none",
        market=Market.OWNED,
        usd_per_hour=3.0,  # dearer than the spot pool
        observed_at=T0,
    )
    history = History.from_offers([owned, point("use1-az1", 0, 2.0), point("use1-az1", 2, 2.0)])
    ran = replay(policy(markets=markets), history, until=T0 + 2 * H)
    assert {s.pool.zone if s.pool else None for s in ran.steps} == {zone}
