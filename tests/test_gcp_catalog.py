"""The fixture SKUs reproduce SkyPilot's published GCP prices (shared catalog, host + GPU rows).

SkyPilot derives its `gcp/vms.csv` from the same Cloud Billing Catalog API, so a VM priced from
our fixture SKUs with our formula must land on the CSV's host row plus its GPU row.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from optimizer.model import Market
from providers.gcp.billing import SkuRecord, build_price_book, instance_price

pytestmark = pytest.mark.catalog
DATA = Path(__file__).parent / "data" / "gcp"
# The CSV rounds to 5 decimals; the SKUs were read back from it, so allow a little more.
TOLERANCE = 5e-4


def _book():
    billing_v1 = pytest.importorskip("google.cloud.billing_v1")
    raw = json.loads((DATA / "skus.json").read_text())["skus"]
    return build_price_book(
        SkuRecord.from_message(billing_v1.Sku.from_json(json.dumps(s))) for s in raw
    )


def _csv_price(catalog: Path, host: str, gpu: str, count: int, region: str, column: str) -> float:
    with open(catalog / "gcp_gpu_vms.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    host_row = next(r for r in rows if r["InstanceType"] == host and r["Region"] == region)
    gpu_row = next(
        r
        for r in rows
        if r["AcceleratorName"] == gpu
        and int(float(r["AcceleratorCount"])) == count
        and r["Region"] == region
    )
    return float(host_row[column]) + float(gpu_row[column])


@pytest.mark.parametrize(
    ("machine", "vcpus", "ram", "accelerator", "gpu", "count", "region"),
    [
        ("a2-highgpu-1g", 12, 85, "nvidia-tesla-a100", "A100", 1, "us-central1"),
        ("a2-highgpu-1g", 12, 85, "nvidia-tesla-a100", "A100", 1, "europe-west4"),
        ("n1-standard-8", 8, 30, "nvidia-tesla-t4", "T4", 1, "us-central1"),
        ("g2-standard-4", 4, 16, "nvidia-l4", "L4", 1, "europe-west4"),
        ("a3-highgpu-8g", 208, 1872, "nvidia-h100-80gb", "H100", 8, "us-central1"),
        ("a3-megagpu-8g", 208, 1872, "nvidia-h100-mega-80gb", "H100-MEGA", 8, "us-central1"),
        ("a3-ultragpu-8g", 224, 2952, "nvidia-h200-141gb", "H200", 8, "europe-west4"),
    ],
)
@pytest.mark.parametrize(
    ("market", "column"), [(Market.ON_DEMAND, "Price"), (Market.SPOT, "SpotPrice")]
)
def test_fixture_prices_match_the_shared_catalog(
    shared_catalog_dir, machine, vcpus, ram, accelerator, gpu, count, region, market, column
) -> None:
    quote = instance_price(
        _book(),
        region=region,
        market=market,
        machine_type=machine,
        vcpus=vcpus,
        ram_gib=ram,
        accelerator=accelerator,
        gpu_count=count,
    )
    expected = _csv_price(shared_catalog_dir, machine, gpu, count, region, column)
    assert quote.usd == pytest.approx(expected, abs=TOLERANCE)
