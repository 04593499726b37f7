"""Offer sources that read files: the bundled list-price snapshot and any catalog CSV.

The snapshot (`optimizer/data/offers_snapshot.csv`) holds public on-demand list prices for
common GPU instance types in a handful of regions, with the date and source of every row.
It carries no spot prices: spot prices are never invented (the local cloud simulates them
and labels them `simulated`). Regenerate it with
`python -m providers.snapshot SKYPILOT_CATALOG_DIR > optimizer/data/offers_snapshot.csv`.
"""

from __future__ import annotations

import io
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from optimizer.catalog import iter_offers, read_catalog, write_catalog
from optimizer.model import Market, Offer

SNAPSHOT_RESOURCE = "offers_snapshot.csv"

# What the snapshot covers (the common GPU families, EU and non-EU European regions included).
SNAPSHOT_REGIONS = {
    "aws": (
        "us-east-1",
        "us-east-2",
        "us-west-2",
        "eu-west-1",
        "eu-central-1",
        "eu-west-2",
        "eu-north-1",
        "ap-northeast-1",
    ),
    "gcp": (
        "us-central1",
        "us-east4",
        "us-west1",
        "europe-west4",
        "europe-west1",
        "europe-west2",
        "europe-west3",
        "asia-northeast1",
    ),
}
AWS_FAMILIES = ("g4dn", "g5", "g6", "g6e", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en")
GCP_N1_HOST = "n1-standard-8"
GCP_N1_GPUS = ("nvidia-tesla-t4", "nvidia-tesla-v100")
# GCP sells these only as Spot, Flex-start or reservations, never on demand (GCP consumption
# options page, as cited in the reference §2.2), so they have no on-demand list price here.
GCP_NOT_ON_DEMAND = ("a3-ultragpu-", "a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g", "a4-")

# The day the catalog revisions below were read; list prices were current then.
SNAPSHOT_DATE = datetime(2026, 4, 23, tzinfo=UTC)
SNAPSHOT_SOURCES = {
    "aws": "AWS price list via skypilot-catalog v7 aws/vms.csv@001367d",
    "gcp": "GCP billing catalog via skypilot-catalog v7 gcp/vms.csv@017e250",
}


# The columns the source's rows are priced in: skypilot-catalog v7 vms.csv, `Price` on-demand
# and `SpotPrice` spot, USD per hour (the shared catalog's SOURCE.md).
SOURCE_PRICE_COLUMNS = ("Price", "SpotPrice")


@dataclass(frozen=True, slots=True)
class Gap:
    """A market the snapshot has no rows of, for which providers, and why."""

    market: Market
    providers: tuple[str, ...]
    why: str

    def __str__(self) -> str:
        return (
            f"the snapshot has no {self.market.value} rows for {' or '.join(self.providers)}: "
            f"{self.why}"
        )


# Every market the snapshot lacks, said once (tests/test_snapshot.py checks the list is whole
# and true of the bundled file, and the reason against the source's columns).
SNAPSHOT_GAPS = (
    Gap(
        Market.SPOT,
        ("aws", "gcp"),
        "spot prices change daily, so a dated list does not carry them and none are "
        "invented (the local cloud simulates them, labelled simulated); live prices come "
        "with --provider aws or gcp",
    ),
    Gap(
        Market.COMMITTED,
        ("aws", "gcp"),
        "its source (the SkyPilot catalog's vms.csv) prices on-demand and spot only, with no "
        "Reserved Instance, Savings Plans or committed use discount rate; --provider aws or "
        "gcp asks the cloud for them",
    ),
    Gap(
        Market.OWNED,
        ("aws", "gcp"),
        "owned machines are the team's own GPU servers, not a cloud's; their offers come "
        "from the ssh provider's inventory (gpuopt machines add), priced by their TCO",
    ),
)


def gaps(market: Market | None = None) -> list[Gap]:
    """What the snapshot lacks: every gap, or the one of `market` (empty when it has rows)."""
    return [g for g in SNAPSHOT_GAPS if market is None or g.market is market]


def load_snapshot() -> list[Offer]:
    """The bundled snapshot's offers."""
    data = resources.files("optimizer") / "data" / SNAPSHOT_RESOURCE
    with data.open("rb") as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as stream:
        return list(iter_offers(stream, path=f"optimizer/data/{SNAPSHOT_RESOURCE}"))


def _in_regions(offers: list[Offer], regions: Sequence[str] | None) -> list[Offer]:
    if regions is None:
        return offers
    wanted = set(regions)
    return [o for o in offers if o.region in wanted]


class SnapshotSource:
    """The embedded default's offers: bundled on-demand list prices, no credentials needed
    (`gaps()` says which markets it has no rows of, and why)."""

    name = "snapshot"
    problems: tuple[str, ...] = ()

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        return _in_regions(load_snapshot(), regions)


class CatalogFileSource:
    """Offers from a catalog CSV a user points at (`gpuopt offers --catalog FILE`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"catalog:{self.path.name}"
        self.problems: tuple[str, ...] = ()

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        return _in_regions(read_catalog(self.path), regions)


def _wanted(offer: Offer) -> bool:
    if offer.market is not Market.ON_DEMAND or offer.region not in SNAPSHOT_REGIONS[offer.provider]:
        return False
    kind = offer.instance_type
    if offer.provider == "aws":
        return kind.split(".", 1)[0] in AWS_FAMILIES
    if kind.startswith("n1-"):
        host, _, accelerator = kind.partition("+")
        return host == GCP_N1_HOST and accelerator.split(":", 1)[0] in GCP_N1_GPUS
    return not kind.startswith(GCP_NOT_ON_DEMAND)


def build_snapshot(catalog_dir: str | Path) -> list[Offer]:
    """Per-region on-demand list prices derived from a SkyPilot catalog folder.

    On-demand prices are per region; when zones of one region disagree, the lowest is kept
    (the price a user can actually get there).
    """
    from providers.skypilot_catalog import read_directory

    by_region: dict[tuple[str, str, str], Offer] = {}
    for offer in read_directory(catalog_dir, SNAPSHOT_DATE):
        if not _wanted(offer):
            continue
        key = (offer.provider, offer.region, offer.instance_type)
        best = by_region.get(key)
        if best is None or offer.usd_per_hour < best.usd_per_hour:
            by_region[key] = replace(offer, zone=None, source=SNAPSHOT_SOURCES[offer.provider])
    return sorted(by_region.values(), key=lambda o: (o.provider, o.region, o.instance_type))


def coverage(offers: Sequence[Offer]) -> dict[str, dict[str, int]]:
    """Rows per provider and region, for docs and tests."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for offer in offers:
        out[offer.provider][offer.region] += 1
    return {p: dict(r) for p, r in out.items()}


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m providers.snapshot SKYPILOT_CATALOG_DIR", file=sys.stderr)
        return 2
    offers = build_snapshot(argv[0])
    write_catalog(
        offers,
        sys.stdout,
        comments=[
            "gpuopt bundled snapshot: public on-demand list prices, USD per hour, per region.",
            f"Prices as listed on {SNAPSHOT_DATE.date()}; sources in the `source` column.",
            "No spot prices: the local cloud simulates those and labels them `simulated`.",
            "Generated by `python -m providers.snapshot`; do not edit by hand.",
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
