"""Reading the SkyPilot catalog rows (real AWS and GCP price data) into Offers."""

from __future__ import annotations

import csv
from collections import Counter
from datetime import UTC, datetime

import pytest

from optimizer import hardware
from optimizer.model import Interconnect, Market
from providers.skypilot_catalog import attached_instance_type, built_in_gpus, read_aws, read_gcp

pytestmark = pytest.mark.catalog
T0 = datetime(2026, 4, 23, tzinfo=UTC)


def rows(path):
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


def test_built_in_gpu_table() -> None:
    assert built_in_gpus("a2-megagpu-16g") == ("A100", 16)
    assert built_in_gpus("a3-ultragpu-8g-nolssd") == ("H200", 8)
    assert built_in_gpus("g2-standard-48") == ("L4", 4)
    assert built_in_gpus("g2-standard-7") is None
    assert built_in_gpus("n2-standard-8") is None


def test_aws_rows_become_one_offer_per_price(shared_catalog_dir) -> None:
    raw = rows(shared_catalog_dir / "aws_gpu_vms.csv")
    unique = {(r["InstanceType"], r["AvailabilityZone"]): r for r in reversed(raw)}
    offers = read_aws(shared_catalog_dir / "aws_gpu_vms.csv", T0)
    by_market = Counter(o.market for o in offers)
    assert by_market[Market.ON_DEMAND] == sum(1 for r in unique.values() if r["Price"])
    assert by_market[Market.SPOT] == sum(1 for r in unique.values() if r["SpotPrice"])
    assert all(o.zone and o.zone[:3] == o.zone[:3].lower() for o in offers)  # zone IDs
    p4de = {o.gpu_model for o in offers if o.instance_type == "p4de.24xlarge"}
    assert p4de == {"A100-80GB"}
    g4ad = next(o for o in offers if o.instance_type.startswith("g4ad"))
    assert hardware.get(g4ad.gpu_model).vendor == "amd"


def test_gcp_vm_price_is_host_plus_gpus_in_the_same_zone(shared_catalog_dir) -> None:
    raw = rows(shared_catalog_dir / "gcp_gpu_vms.csv")
    zone = "us-central1-a"
    host = next(
        r for r in raw if r["InstanceType"] == "a2-highgpu-1g" and r["AvailabilityZone"] == zone
    )
    gpu = next(
        r
        for r in raw
        if r["AcceleratorName"] == "A100"
        and r["AcceleratorCount"] == "1"
        and r["AvailabilityZone"] == zone
    )
    offers = read_gcp(shared_catalog_dir / "gcp_gpu_vms.csv", T0)
    got = {o.market: o for o in offers if o.instance_type == "a2-highgpu-1g" and o.zone == zone}
    assert got[Market.ON_DEMAND].usd_per_hour == pytest.approx(
        float(host["Price"]) + float(gpu["Price"])
    )
    assert got[Market.SPOT].usd_per_hour == pytest.approx(
        float(host["SpotPrice"]) + float(gpu["SpotPrice"])
    )
    assert got[Market.ON_DEMAND].gpu_model == "A100-40GB"


def test_gcp_n1_hosts_get_attached_gpus(shared_catalog_dir) -> None:
    offers = read_gcp(shared_catalog_dir / "gcp_gpu_vms.csv", T0)
    kind = attached_instance_type("n1-standard-8", "nvidia-tesla-v100", 8)
    v100 = [o for o in offers if o.instance_type == kind]
    assert v100 and all(o.gpu_model == "V100-16GB" and o.gpu_count == 8 for o in v100)
    mega = [o for o in offers if o.instance_type == "a3-megagpu-8g"]
    assert mega and {(o.gpu_model, o.interconnect) for o in mega} == {
        ("H100-80GB", Interconnect.NVLINK)
    }
    assert all(hardware.get(o.gpu_model).known for o in offers)
