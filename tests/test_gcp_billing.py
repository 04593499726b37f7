"""Reading Cloud Billing Catalog SKUs into unit prices, and instance prices from them (pure)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from optimizer.model import Market
from providers.gcp.billing import (
    PriceBook,
    Resource,
    SkuRate,
    SkuRecord,
    Unmapped,
    billing_series,
    build_price_book,
    instance_price,
    read_sku,
)

DATA = Path(__file__).parent / "data" / "gcp"
US = ("us-central1",)


def sku(
    description: str,
    usd: float,
    *,
    group: str = "GPU",
    usage: str = "OnDemand",
    regions: tuple[str, ...] = US,
    unit: str = "h",
    family: str = "Compute",
    currency: str = "USD",
) -> SkuRecord:
    units = int(usd)
    return SkuRecord(
        sku_id="0000-1111-2222",
        description=description,
        resource_family=family,
        resource_group=group,
        usage_type=usage,
        service_regions=regions,
        usage_unit=unit,
        currency=currency,
        units=units,
        nanos=round((usd - units) * 1e9),
    )


# Descriptions as the catalog writes them (REFERENCE §2.3; gpuhunt and SkyPilot aliases).
MAPPED = [
    ("N1 Predefined Instance Core running in Americas", "N1Standard", "h", Resource.CORE, "n1"),
    ("N1 Predefined Instance Ram running in Americas", "N1Standard", "GiBy.h", Resource.RAM, "n1"),
    ("A2 Instance Core running in Americas", "CPU", "h", Resource.CORE, "a2"),
    ("A2 Instance Ram running in Netherlands", "RAM", "GiBy.h", Resource.RAM, "a2"),
    ("A3 Instance Core running in Japan", "CPU", "h", Resource.CORE, "a3"),
    ("A3Plus Instance Ram running in Americas", "RAM", "GiBy.h", Resource.RAM, "a3plus"),
    ("G2 Instance Core running in Americas", "CPU", "h", Resource.CORE, "g2"),
    ("Nvidia Tesla T4 GPU running in Americas", "GPU", "h", Resource.GPU, "nvidia-tesla-t4"),
    ("Nvidia Tesla V100 GPU running in Americas", "GPU", "h", Resource.GPU, "nvidia-tesla-v100"),
    ("Nvidia L4 GPU running in Netherlands", "GPU", "h", Resource.GPU, "nvidia-l4"),
    ("Nvidia Tesla A100 GPU running in Americas", "GPU", "h", Resource.GPU, "nvidia-tesla-a100"),
    (
        "Nvidia Tesla A100 80GB GPU running in Americas",
        "GPU",
        "h",
        Resource.GPU,
        "nvidia-a100-80gb",
    ),
    ("Nvidia H100 80GB GPU running in Americas", "GPU", "h", Resource.GPU, "nvidia-h100-80gb"),
    (
        "Nvidia H100 80GB Mega GPU running in Americas",
        "GPU",
        "h",
        Resource.GPU,
        "nvidia-h100-mega-80gb",
    ),
    (
        "Nvidia H100 80GB Plus GPU running in Japan",
        "GPU",
        "h",
        Resource.GPU,
        "nvidia-h100-mega-80gb",
    ),
    ("Nvidia H200 141GB GPU running in Netherlands", "GPU", "h", Resource.GPU, "nvidia-h200-141gb"),
]


@pytest.mark.parametrize(("description", "group", "unit", "resource", "name"), MAPPED)
def test_compute_skus_map_to_a_resource_and_name(description, group, unit, resource, name) -> None:
    for usage, prefix, market in (
        ("OnDemand", "", Market.ON_DEMAND),
        ("Preemptible", "Spot Preemptible ", Market.SPOT),
    ):
        rate = read_sku(sku(prefix + description, 1.25, group=group, usage=usage, unit=unit))
        assert rate == SkuRate(resource, name, market, US, 1.25)


def test_price_is_units_plus_nanos() -> None:
    record = replace(
        sku("Nvidia Tesla A100 GPU running in Americas", 0), units=2, nanos=933_908_000
    )
    assert record.usd == 2.933908


def test_a_gpu_slice_sku_includes_the_vm() -> None:
    rate = read_sku(sku("Nvidia B200 (1 gpu slice) running in Americas", 12.5))
    assert isinstance(rate, SkuRate)
    assert (rate.name, rate.includes_host) == ("nvidia-b200", True)


@pytest.mark.parametrize(
    ("description", "group", "usage", "family"),
    [
        ("Commitment v1: A2 Cpu in Americas for 1 Year", "CPU", "Commit1Yr", "Compute"),
        (
            "Commitment v1: Nvidia Tesla A100 GPU in Americas for 1 Year",
            "GPU",
            "Commit3Yr",
            "Compute",
        ),
        ("Custom Instance Core running in Americas", "CPU", "OnDemand", "Compute"),
        ("N1 Custom Instance Ram running in Americas", "RAM", "OnDemand", "Compute"),
        ("Sole Tenancy Instance Core Premium running in Americas", "CPU", "OnDemand", "Compute"),
        ("Reserved A2 Instance Core running in Americas", "CPU", "OnDemand", "Compute"),
        ("E2 Instance Core running in Americas", "CPU", "OnDemand", "Compute"),
        ("Balanced PD Capacity in Americas", "SSD", "OnDemand", "Storage"),
        (
            "Nvidia Tesla T4 Virtual Workstation GPU running in Americas",
            "GPU",
            "OnDemand",
            "Compute",
        ),
    ],
)
def test_commitment_custom_and_unrelated_skus_are_ignored(
    description, group, usage, family
) -> None:
    assert read_sku(sku(description, 0.5, group=group, usage=usage, family=family)) is None


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (sku("Nvidia Tesla K80 GPU running in Americas", 0.45), "matches no known accelerator"),
        (
            sku("A3 Ultra Instance Core running in Americas", 0.03, group="CPU"),
            "not a known GPU VM",
        ),
        (sku("Nvidia L4 GPU running in Americas", 400, unit="mo"), "usage unit 'mo'"),
        (sku("Nvidia L4 GPU running in Americas", 0.6, currency="EUR"), "currency 'EUR'"),
        (sku("Nvidia L4 GPU running in Americas", 0.6, regions=()), "no service regions"),
        (sku("GPU attached to something new", 1.0), "not a GPU, core or RAM price"),
    ],
)
def test_gpu_vm_skus_that_cannot_be_read_are_reported_with_their_description(record, why) -> None:
    result = read_sku(record)
    assert isinstance(result, Unmapped)
    assert why in result.why
    assert record.description in str(result)


def test_price_book_reports_unmapped_skus_once_and_never_prices_them() -> None:
    k80 = sku("Nvidia Tesla K80 GPU running in Americas", 0.45)
    book = build_price_book([k80, k80, sku("Nvidia Tesla T4 GPU running in Americas", 0.35)])
    assert book.problems == [str(read_sku(k80))]
    assert book.rate("us-central1", Market.ON_DEMAND, Resource.GPU, "nvidia-tesla-t4") == 0.35
    assert not any("k80" in key[3] for key in book.rates)


def test_conflicting_skus_for_one_price_are_reported_and_dropped() -> None:
    one = sku("Nvidia Tesla T4 GPU running in Americas", 0.35)
    other = sku("Nvidia Tesla T4 GPU running in Iowa", 0.40)
    book = build_price_book([one, other, one])
    assert book.rate("us-central1", Market.ON_DEMAND, Resource.GPU, "nvidia-tesla-t4") is None
    assert len(book.problems) == 1 and "conflicting" in book.problems[0]


def test_a_sku_applies_to_each_of_its_service_regions() -> None:
    regions = ("us-central1", "us-east1", "us-west1")
    book = build_price_book([sku("Nvidia Tesla T4 GPU running in Americas", 0.35, regions=regions)])
    for region in regions:
        assert book.rate(region, Market.ON_DEMAND, Resource.GPU, "nvidia-tesla-t4") == 0.35


@pytest.mark.parametrize(
    ("machine", "series"),
    [
        ("n1-standard-8", "n1"),
        ("a2-highgpu-1g", "a2"),
        ("a2-ultragpu-8g", "a2"),
        ("a3-highgpu-8g", "a3"),
        ("a3-edgegpu-8g", "a3"),
        ("a3-ultragpu-8g", "a3"),
        ("a3-megagpu-8g", "a3plus"),
        ("g2-standard-24", "g2"),
        ("g4-standard-48", None),
    ],
)
def test_billing_series_of_machine_types(machine, series) -> None:
    assert billing_series(machine) == series


def _book(*records: SkuRecord) -> PriceBook:
    return build_price_book(records)


def test_instance_price_is_vcpus_ram_and_gpus_of_the_series() -> None:
    book = _book(
        sku("A2 Instance Core running in Americas", 0.031611, group="CPU"),
        sku("A2 Instance Ram running in Americas", 0.004237, group="RAM", unit="GiBy.h"),
        sku("Nvidia Tesla A100 GPU running in Americas", 2.933908),
    )
    quote = instance_price(
        book,
        region="us-central1",
        market=Market.ON_DEMAND,
        machine_type="a2-highgpu-8g",
        vcpus=96,
        ram_gib=680,
        accelerator="nvidia-tesla-a100",
        gpu_count=8,
    )
    assert quote.usd == pytest.approx(96 * 0.031611 + 680 * 0.004237 + 8 * 2.933908)


def test_instance_price_names_every_missing_sku() -> None:
    book = _book(sku("A2 Instance Core running in Americas", 0.031611, group="CPU"))
    quote = instance_price(
        book,
        region="us-central1",
        market=Market.SPOT,
        machine_type="a2-highgpu-1g",
        vcpus=12,
        ram_gib=85,
        accelerator="nvidia-tesla-a100",
        gpu_count=1,
    )
    assert quote.usd is None
    assert set(quote.missing) == {"nvidia-tesla-a100 GPU", "a2 core", "a2 RAM"}


def test_a_slice_priced_gpu_needs_no_core_or_ram_sku() -> None:
    book = _book(sku("Spot Preemptible Nvidia B200 (1 gpu slice)", 3.5, usage="Preemptible"))
    quote = instance_price(
        book,
        region="us-central1",
        market=Market.SPOT,
        machine_type="a4-highgpu-8g",
        vcpus=224,
        ram_gib=3968,
        accelerator="nvidia-b200",
        gpu_count=8,
    )
    assert quote.usd == pytest.approx(28.0)


def test_records_read_from_the_billing_clients_own_messages() -> None:
    billing_v1 = pytest.importorskip("google.cloud.billing_v1")
    raw = json.loads((DATA / "skus.json").read_text())["skus"]
    a100 = next(s for s in raw if s["description"] == "Nvidia Tesla A100 GPU running in Americas")
    message = billing_v1.Sku.from_json(json.dumps(a100))
    record = SkuRecord.from_message(message)
    assert record.usd == pytest.approx(2.933908)
    assert (record.resource_group, record.usage_type, record.usage_unit) == ("GPU", "OnDemand", "h")
    assert read_sku(record) == SkuRate(
        Resource.GPU, "nvidia-tesla-a100", Market.ON_DEMAND, US, 2.933908
    )
