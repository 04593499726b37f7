"""The local cloud's price list: snapshot on-demand rows, simulated spot below them, and
compliance rules that work on local offers as on AWS/GCP ones."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from optimizer.model import Market
from policies import regions
from policies.engine import evaluate
from policies.loader import load_policy
from providers.local import SIMULATED, LocalCloud, SpotWalk
from providers.local.prices import STEP_S
from providers.snapshot import load_snapshot

T0 = datetime(2026, 11, 30, tzinfo=UTC).timestamp()


def cloud_at(tmp_path: Path, t: float, seed: int = 0) -> LocalCloud:
    return LocalCloud(tmp_path, seed=seed, clock=lambda: t)


def test_every_snapshot_row_is_offered_on_demand_at_its_list_price(tmp_path: Path) -> None:
    snapshot = load_snapshot()
    offers = cloud_at(tmp_path, T0).fetch_offers()
    on_demand = [o for o in offers if o.market is Market.ON_DEMAND]
    assert len(on_demand) == len(snapshot)
    for row, offer in zip(snapshot, on_demand, strict=True):
        assert (offer.provider, offer.zone) == ("local", None)
        assert (offer.region, offer.instance_type) == (row.region, row.instance_type)
        assert offer.usd_per_hour == row.usd_per_hour and row.source in offer.source
        assert offer.observed_at.timestamp() == T0


def test_spot_is_simulated_per_zone_and_below_on_demand(tmp_path: Path) -> None:
    offers = cloud_at(tmp_path, T0).fetch_offers(["eu-west-1", "europe-west4"])
    assert {o.region for o in offers} == {"eu-west-1", "europe-west4"}
    on_demand = {(o.region, o.instance_type): o for o in offers if o.market is Market.ON_DEMAND}
    spot = [o for o in offers if o.market is Market.SPOT]
    assert len(spot) == 2 * len(on_demand)
    for offer in spot:
        assert offer.source == SIMULATED
        assert offer.zone in (f"{offer.region}-a", f"{offer.region}-b")
        list_price = on_demand[(offer.region, offer.instance_type)].usd_per_hour
        assert 0.3 * list_price - 1e-4 <= list_price - offer.usd_per_hour <= 0.7 * list_price + 1e-4


def test_prices_depend_on_the_seed_and_move_with_time_only(tmp_path: Path) -> None:
    def spot_prices(seed: int, t: float) -> list[float]:
        offers = cloud_at(tmp_path, t, seed).fetch_offers(["us-east-1"])
        return [o.usd_per_hour for o in offers if o.market is Market.SPOT]

    assert spot_prices(0, T0) == spot_prices(0, T0)  # another process, the same prices
    assert spot_prices(0, T0) != spot_prices(1, T0)
    assert spot_prices(0, T0) == spot_prices(0, T0 + STEP_S / 3)  # within one step
    later = spot_prices(0, T0 + 6 * STEP_S)
    assert later != spot_prices(0, T0)
    moved = [abs(a - b) for a, b in zip(later, spot_prices(0, T0), strict=True)]
    assert sum(moved) / len(moved) < 0.2 * max(later)  # a walk, not a fresh draw


def test_the_walk_stays_inside_its_band_for_a_simulated_week() -> None:
    walk = SpotWalk(7, (0.4, 0.6))
    values = [walk.discount("pool", T0 + n * STEP_S) for n in range(0, 7 * 144, 7)]
    assert all(0.4 <= v <= 0.6 for v in values) and len(set(values)) > 50
    with pytest.raises(ValueError):
        SpotWalk(0, (0.7, 0.3))


def test_local_regions_resolve_to_the_clouds_that_own_their_names() -> None:
    ireland = regions.lookup("local", "eu-west-1")
    netherlands = regions.lookup("LOCAL", "europe-west4")
    assert ireland is not None and ireland.country == "IE"
    assert netherlands is not None and netherlands.country == "NL"
    assert regions.lookup("local", "mars-north-1") is None
    assert regions.lookup("aws", "europe-west4") is None  # no borrowing between real clouds
    assert regions.check("local", "eu-west-2", compliance="eu") is not None  # London
    assert regions.check("local", "eu-central-1", compliance="gdpr") is None


def test_a_gdpr_policy_on_the_local_cloud_keeps_to_eu_regions(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: local-eu\n"
        "workload: {type: training, gpus: 1, gpu_memory_gib: 10}\n"
        "placement: {providers: [local], compliance: eu}\n"
    )
    offers = cloud_at(tmp_path / "cloud", T0).fetch_offers()
    ranking = evaluate(load_policy(path), offers, datetime.fromtimestamp(T0, UTC))
    assert ranking.candidates
    chosen = {c.offer.region for c in ranking.candidates}
    assert chosen <= {r.name for r in regions.all_regions() if r.eea}
    assert "eu-west-1" in chosen and "europe-west4" in chosen
    assert ranking.best is not None and ranking.best.offer.market is Market.SPOT
    london = [
        r for r in ranking.rejections_by_rule()["compliance"] if r.offer.region == "eu-west-2"
    ]
    assert london and "outside the EU/EEA" in london[0].reason
