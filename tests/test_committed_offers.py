"""The `committed` market in the Offer, the catalog and the store (docs/catalog-format.md)."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest

from optimizer.catalog import CatalogError, parse_catalog, write_catalog
from optimizer.model import Interconnect, Market, Offer, OfferError, PaymentOption
from optimizer.store import Store

AT = datetime(2026, 11, 1, tzinfo=UTC)


def commitment(**changes: object) -> Offer:
    values: dict[str, object] = {
        "provider": "aws",
        "region": "us-east-1",
        "zone": None,
        "instance_type": "p4d.24xlarge",
        "gpu_model": "A100-40GB",
        "gpu_count": 8,
        "gpu_memory_gib": 40.0,
        "vcpus": 96,
        "ram_gib": 1152.0,
        "interconnect": Interconnect.NVLINK,
        "market": Market.COMMITTED,
        "usd_per_hour": 12.0,
        "observed_at": AT,
        "term_years": 3,
        "payment_option": PaymentOption.PARTIAL_UPFRONT,
        "upfront_usd": 157_680.0,  # 6.00 x 26,280 h
    }
    values.update(changes)
    return Offer(**values)  # type: ignore[arg-type]


def test_effective_price_splits_into_upfront_and_hourly_fee() -> None:
    offer = commitment()
    assert offer.term_hours == 26_280
    assert offer.recurring_usd_per_hour == pytest.approx(6.0)
    assert commitment(payment_option="no_upfront", upfront_usd=None).upfront_usd == 0.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"term_years": None}, "term_years must be >= 1"),
        ({"payment_option": None}, "payment_option must be given"),
        ({"upfront_usd": 400_000.0}, "upfront_usd 400000.0 is more than"),
        ({"market": Market.ON_DEMAND}, "term_years (like payment_option"),
        ({"payment_option": "monthly"}, "'monthly' is not a valid PaymentOption"),
    ],
)
def test_a_commitment_needs_consistent_terms(changes: dict[str, object], message: str) -> None:
    with pytest.raises((OfferError, ValueError)) as caught:
        commitment(**changes)
    assert message in str(caught.value)


def test_catalog_round_trips_a_commitment_and_locates_a_bad_option() -> None:
    out = io.StringIO()
    write_catalog([commitment()], out)
    text = out.getvalue()
    assert text.splitlines()[1].endswith(",3,partial_upfront,157680.0")
    assert parse_catalog(text) == [commitment()]
    bad = text.replace("partial_upfront", "weekly")
    with pytest.raises(CatalogError) as caught:
        parse_catalog(bad, path="x.csv")
    assert caught.value.field == "payment_option" and caught.value.line == 2
    assert "'weekly' is not one of: no_upfront, partial_upfront, all_upfront" in str(caught.value)
    # a committed row without its term is located at the term's column
    missing = text.replace(",3,partial_upfront", ",,partial_upfront")
    with pytest.raises(CatalogError, match=r"x.csv:2:\d+: term_years: term_years must be >= 1"):
        parse_catalog(missing, path="x.csv")


def test_the_store_keeps_prices_in_effect_not_commitments(store: Store) -> None:
    on_demand = commitment(
        market=Market.ON_DEMAND,
        usd_per_hour=21.96,
        term_years=None,
        payment_option=None,
        upfront_usd=None,
    )
    written = store.prices.record_offers(
        [on_demand, commitment(), commitment(term_years=1, upfront_usd=0.0)]
    )
    assert written == 1
    assert store.prices.latest_offers() == [on_demand]
