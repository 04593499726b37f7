"""GCP committed use discounts from Cloud Billing Catalog SKUs (usageType Commit1Yr/Commit3Yr),
priced like the on-demand SKUs: vCPUs x core + GiB x RAM + GPUs x GPU, per term (pure)."""

from __future__ import annotations

import pytest

from optimizer.model import Market
from providers.gcp.billing import (
    Resource,
    SkuRecord,
    Unmapped,
    build_commitment_books,
    instance_price,
    read_commitment_sku,
)


def sku(
    description: str, usd: float, *, group: str = "GPU", usage: str = "OnDemand", unit: str = "h"
) -> SkuRecord:
    """A catalog SKU's fields as pricing reads them (SkuRecord.from_message's output)."""
    units = int(usd)
    return SkuRecord(
        sku_id="0000-1111-2222",
        description=description,
        resource_family="Compute",
        resource_group=group,
        usage_type=usage,
        service_regions=("us-central1",),
        usage_unit=unit,
        currency="USD",
        units=units,
        nanos=round((usd - units) * 1e9),
    )


A2_1Y = [
    sku("Commitment v1: A2 Cpu in Americas for 1 Year", 0.019915, group="CPU", usage="Commit1Yr"),
    sku(
        "Commitment v1: A2 Ram in Americas for 1 Year",
        0.002669,
        group="RAM",
        usage="Commit1Yr",
        unit="GiBy.h",
    ),
    sku("Commitment v1: Nvidia Tesla A100 GPU in Americas for 1 Year", 1.851, usage="Commit1Yr"),
]
A2_3Y = [
    sku("Commitment v1: A2 Cpu in Americas for 3 Year", 0.014225, group="CPU", usage="Commit3Yr"),
    sku(
        "Commitment v1: A2 Ram in Americas for 3 Year",
        0.001907,
        group="RAM",
        usage="Commit3Yr",
        unit="GiBy.h",
    ),
    sku("Commitment v1: Nvidia Tesla A100 GPU in Americas for 3 Year", 1.0285, usage="Commit3Yr"),
]


def quote(term: int, skus: list) -> float | None:
    book = build_commitment_books(skus)[term]
    return instance_price(
        book,
        region="us-central1",
        market=Market.COMMITTED,
        machine_type="a2-highgpu-1g",
        vcpus=12,
        ram_gib=85.0,
        accelerator="nvidia-tesla-a100",
        gpu_count=1,
    ).usd


def test_a_commitment_prices_the_whole_vm_per_term() -> None:
    skus = A2_1Y + A2_3Y
    # 12 x 0.019915 + 85 x 0.002669 + 1.851 = 2.316845 $/h for every hour of the year
    assert quote(1, skus) == pytest.approx(2.316845)
    # 12 x 0.014225 + 85 x 0.001907 + 1.0285 = 1.361295
    assert quote(3, skus) == pytest.approx(1.361295)


def test_commitment_skus_are_read_by_term_and_resource() -> None:
    term, rate = read_commitment_sku(A2_3Y[2])  # type: ignore[misc]
    assert (term, rate.resource, rate.name, rate.market) == (
        3,
        Resource.GPU,
        "nvidia-tesla-a100",
        Market.COMMITTED,
    )
    # the general N1 'Cpu' SKU names no series: not ours; on-demand SKUs: not commitments
    assert (
        read_commitment_sku(
            sku("Commitment v1: Cpu in Montreal for 1 Year", 0.02, group="CPU", usage="Commit1Yr")
        )
        is None
    )
    assert read_commitment_sku(sku("Nvidia Tesla A100 GPU running in Americas", 2.9)) is None


def test_unreadable_gpu_commitments_are_reported_not_guessed() -> None:
    wrong_term = sku("Commitment v1: Nvidia L4 GPU in Americas for 1 Year", 0.3, usage="Commit3Yr")
    unknown = sku("Commitment v1: Nvidia Z900 GPU in Americas for 1 Year", 9.9, usage="Commit1Yr")
    assert isinstance(read_commitment_sku(wrong_term), Unmapped)
    assert isinstance(read_commitment_sku(unknown), Unmapped)
    books = build_commitment_books([wrong_term, unknown, *A2_1Y[:2]])
    assert any("Z900" in p for p in books[1].problems)
    assert quote(1, A2_1Y[:2]) is None  # no GPU rate: no price, never a partial one
