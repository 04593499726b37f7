"""The offer query behind `gpuopt offers`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from optimizer.model import Interconnect, Market, Offer, OfferError
from optimizer.offers import OfferQuery, select
from tests.helpers import make_offer

T0 = datetime(2026, 4, 23, tzinfo=UTC)


A100 = dict(
    provider="gcp",
    zone=None,
    instance_type="a2-ultragpu-1g",
    gpu_model="A100-80GB",
    gpu_count=1,
    gpu_memory_gib=80.0,
    vcpus=12,
    ram_gib=170.0,
    interconnect=Interconnect.NONE,
    market=Market.ON_DEMAND,
    observed_at=T0,
    source="",
)


def offer(region: str, price: float, **changes: object) -> Offer:
    """One A100-80GB on demand on GCP in `region` at `price` $/h."""
    return make_offer(**{**A100, "region": region, "usd_per_hour": price, **changes})


ROWS = [
    offer("europe-west4", 5.0),
    offer("us-central1", 4.0),
    offer("europe-west2", 4.5),
    offer("us-east1", 1.0, gpu_model="T4", gpu_memory_gib=16.0, instance_type="n1+t4"),
    offer("us-east1", 0.9, market=Market.SPOT, gpu_count=8, instance_type="a2-ultragpu-8g"),
]


def test_cheapest_first_and_everything_by_default() -> None:
    assert [o.usd_per_hour for o in select(ROWS, OfferQuery())] == [0.9, 1.0, 4.0, 4.5, 5.0]


def test_region_globs_use_each_clouds_names() -> None:
    got = select(ROWS, OfferQuery(region_globs=("europe-*",)))
    assert [o.region for o in got] == ["europe-west2", "europe-west4"]


def test_filters_combine() -> None:
    query = OfferQuery(
        gpu_models=("A100-80GB",),
        min_gpu_memory_gib=40,
        market=Market.ON_DEMAND,
        max_usd_per_hour=4.5,
    )
    assert [o.region for o in select(ROWS, query)] == ["us-central1", "europe-west2"]
    assert [o.gpu_count for o in select(ROWS, OfferQuery(min_gpus=2))] == [8]
    assert select(ROWS, OfferQuery(providers=("aws",))) == []


def test_ties_break_on_place_not_input_order() -> None:
    a, b = offer("b-region", 1.0), offer("a-region", 1.0)
    assert select([a, b], OfferQuery()) == select([b, a], OfferQuery()) == [b, a]


def test_offer_is_immutable_and_validated() -> None:
    row = ROWS[0]
    with pytest.raises(AttributeError):
        row.usd_per_hour = 0.0  # type: ignore[misc]
    with pytest.raises(OfferError, match="usd_per_hour"):
        offer("x", -1.0)
    with pytest.raises(OfferError, match="timezone-aware"):
        offer("x", 1.0, observed_at=datetime(2026, 1, 1))
    assert offer("x", 1.0, zone="").zone is None
    assert row.usd_per_gpu_hour == 5.0
    assert ROWS[4].usd_per_gpu_hour == pytest.approx(0.1125)


def test_an_offer_read_back_from_its_json_is_the_same_offer() -> None:
    regional = make_offer(zone=None, market=Market.ON_DEMAND, placement_score=7.5)
    for offer in (make_offer(), regional):
        assert Offer.from_dict(offer.to_dict()) == offer
    broken = {**make_offer().to_dict(), "observed_at": "yesterday"}
    with pytest.raises(OfferError, match="not an offer: ValueError"):
        Offer.from_dict(broken)
    with pytest.raises(OfferError, match="usd_per_hour must be a finite number"):
        Offer.from_dict({**make_offer().to_dict(), "usd_per_hour": -1})
