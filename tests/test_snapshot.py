"""The bundled list-price snapshot: coverage, provenance, and agreement with its source."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import pytest

from optimizer import hardware
from optimizer.model import Market
from providers.base import OfferSource
from providers.snapshot import (
    SNAPSHOT_DATE,
    SNAPSHOT_GAPS,
    SNAPSHOT_SOURCES,
    SOURCE_PRICE_COLUMNS,
    CatalogFileSource,
    SnapshotSource,
    build_snapshot,
    load_snapshot,
)

EU_AND_EUROPE = {
    "aws": {"eu-west-1", "eu-central-1", "eu-west-2"},
    "gcp": {"europe-west4", "europe-west1", "europe-west2"},
}


@pytest.fixture(scope="module")
def snapshot():
    return load_snapshot()


def test_sources_satisfy_the_offer_source_contract(tmp_path: Path) -> None:
    assert isinstance(SnapshotSource(), OfferSource)
    assert isinstance(CatalogFileSource(tmp_path / "x.csv"), OfferSource)


def test_every_row_is_a_dated_sourced_on_demand_list_price(snapshot) -> None:
    assert len(snapshot) > 100
    for offer in snapshot:
        assert offer.market is Market.ON_DEMAND  # spot prices are never invented
        assert offer.observed_at == SNAPSHOT_DATE
        assert offer.source == SNAPSHOT_SOURCES[offer.provider]
        assert offer.zone is None  # on-demand list prices are per region
        assert offer.usd_per_hour > 0
        assert hardware.get(offer.gpu_model).known, offer


def test_covers_the_common_families_in_eu_and_non_eu_european_regions(snapshot) -> None:
    regions = defaultdict(set)
    families = defaultdict(set)
    for offer in snapshot:
        regions[offer.provider].add(offer.region)
        kind = offer.instance_type
        family = kind.split(".")[0] if offer.provider == "aws" else kind.split("-")[0]
        if kind.startswith("n1-"):
            family = "n1+" + kind.split("+")[1].split(":")[0]
        families[offer.provider].add(family)
    for provider, wanted in EU_AND_EUROPE.items():
        assert wanted <= regions[provider]
    assert {"g4dn", "g5", "g6", "g6e", "p3", "p4d", "p4de", "p5"} <= families["aws"]
    assert {"n1+nvidia-tesla-t4", "n1+nvidia-tesla-v100", "g2", "a2", "a3"} <= families["gcp"]


def test_gcp_types_sold_only_as_spot_have_no_on_demand_row(snapshot) -> None:
    kinds = {o.instance_type for o in snapshot if o.provider == "gcp"}
    assert not any(k.startswith("a3-ultragpu") for k in kinds)
    assert "a3-highgpu-1g" not in kinds and "a3-highgpu-8g" in kinds


def test_region_filter(snapshot) -> None:
    got = SnapshotSource().fetch_offers(["europe-west4"])
    assert got and {o.region for o in got} == {"europe-west4"}
    assert len(got) == sum(1 for o in snapshot if o.region == "europe-west4")


@pytest.mark.catalog
def test_snapshot_is_exactly_what_the_source_catalog_gives(snapshot, shared_catalog_dir) -> None:
    assert build_snapshot(shared_catalog_dir) == snapshot


@pytest.mark.catalog
def test_aws_prices_match_the_source_rows(snapshot, shared_catalog_dir) -> None:
    listed: dict[tuple[str, str], set[float]] = defaultdict(set)
    with open(shared_catalog_dir / "aws_gpu_vms.csv", newline="") as stream:
        for row in csv.DictReader(stream):
            if row["Price"]:
                listed[(row["Region"], row["InstanceType"])].add(float(row["Price"]))
    aws = [o for o in snapshot if o.provider == "aws"]
    assert aws
    for offer in aws:
        assert offer.usd_per_hour == min(listed[(offer.region, offer.instance_type)])
    p4d = next(o for o in aws if o.instance_type == "p4d.24xlarge" and o.region == "us-east-1")
    assert (p4d.gpu_model, p4d.gpu_count, p4d.interconnect.value) == ("A100-40GB", 8, "nvlink")


def test_the_snapshot_names_every_market_it_has_no_rows_of(snapshot) -> None:
    held = {o.market for o in snapshot}
    said = {gap.market for gap in SNAPSHOT_GAPS}
    assert held | said == set(Market) and not held & said  # whole, and true of the file
    assert said == {Market.SPOT, Market.COMMITTED, Market.OWNED}
    providers = tuple(sorted({o.provider for o in snapshot}))
    assert all(tuple(sorted(gap.providers)) == providers for gap in SNAPSHOT_GAPS)
    docs = (Path(__file__).parents[1] / "docs" / "snapshot.md").read_text()
    assert "No commitment rows" in docs and "No spot prices" in docs
    assert "owned" in docs


@pytest.mark.catalog
def test_its_source_has_no_commitment_price_to_carry(shared_catalog_dir) -> None:
    for name in ("aws_gpu_vms.csv", "gcp_gpu_vms.csv"):
        with open(shared_catalog_dir / name, newline="") as stream:
            header = next(csv.reader(stream))
        priced = tuple(c for c in header if "price" in c.lower())
        assert priced == SOURCE_PRICE_COLUMNS, name  # on-demand and spot, nothing else
        words = ("reserv", "commit", "saving", "upfront", "term")
        assert not [c for c in header if any(w in c.lower() for w in words)], name
