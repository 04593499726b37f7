"""GCP committed use discounts from Cloud Billing Catalog SKUs (usageType Commit1Yr/Commit3Yr),
priced like the on-demand SKUs: vCPUs x core + GiB x RAM + GPUs x GPU, per term; the pure
reading, then the provider's poll against the fake Billing and Compute APIs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from optimizer.model import Market, PaymentOption
from providers.gcp.billing import (
    Resource,
    SkuRecord,
    Unmapped,
    build_commitment_books,
    instance_price,
    read_commitment_sku,
)
from tests.helpers.gcp import A2_COMMITMENT_SKUS, DATA
from tests.helpers.gcp_fake import COMPUTE_SERVICE_ID


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


# --- the provider's poll against the fake Compute and Billing APIs ------------------------

T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
SKUS_PATH = f"/v1/services/{COMPUTE_SERVICE_ID}/skus"


# a2-highgpu-1g: 12 vCPUs, 85 GiB, 1 A100 40GB; a2-highgpu-8g: 96, 680 GiB, 8;
# a2-megagpu-16g: 96, 1,360 GiB, 16 (tests/data/gcp/machine_types.json).
A2_1G_1Y = 12 * 0.019915 + 85 * 0.002669 + 1.848362  # 2.314207 $/h
A2_1G_3Y = 12 * 0.014225 + 85 * 0.001907 + 1.0285  # 1.361295 $/h
A2_8G_1Y = 96 * 0.019915 + 680 * 0.002669 + 8 * 1.848362  # 18.513656
A2_16G_3Y = 96 * 0.014225 + 1360 * 0.001907 + 16 * 1.0285  # 20.41912


@pytest.fixture
def fake() -> Iterator[Any]:
    pytest.importorskip("google.cloud.compute_v1")
    from tests.helpers.gcp_fake import FakeGcp

    with FakeGcp.from_recorded(DATA) as server:
        server.skus[COMPUTE_SERVICE_ID].extend(A2_COMMITMENT_SKUS)
        yield server


def provider(fake: Any, **kwargs: Any) -> Any:
    from google.auth.credentials import AnonymousCredentials

    from providers.gcp import GcpProvider

    return GcpProvider(
        "gpuopt-test",
        client_options={"api_endpoint": fake.url},
        credentials=AnonymousCredentials(),
        transport="rest",
        clock=lambda: T0,
        **kwargs,
    )


def test_a_poll_with_commitments_prices_each_vm_per_term_from_the_same_sku_list(fake) -> None:
    gcp = provider(fake, commitments=True)
    offers = gcp.fetch_offers(["us-central1", "europe-west4"])
    assert len(fake.calls("GET", SKUS_PATH)) == 1  # commitments cost no call of their own
    committed = {(o.instance_type, o.term_years): o for o in offers if o.market is Market.COMMITTED}
    assert set(committed) == {
        (kind, term)
        for kind in ("a2-highgpu-1g", "a2-highgpu-8g", "a2-megagpu-16g")
        for term in (1, 3)
    }
    assert committed[("a2-highgpu-1g", 1)].usd_per_hour == pytest.approx(2.314207)
    assert committed[("a2-highgpu-1g", 3)].usd_per_hour == pytest.approx(1.361295)
    assert committed[("a2-highgpu-8g", 1)].usd_per_hour == pytest.approx(A2_8G_1Y)
    assert committed[("a2-megagpu-16g", 3)].usd_per_hour == pytest.approx(A2_16G_3Y)
    assert pytest.approx((2.314207, 1.361295)) == (A2_1G_1Y, A2_1G_3Y)
    for offer in committed.values():
        assert (offer.region, offer.zone, offer.payment_option, offer.upfront_usd) == (
            "us-central1",
            None,
            PaymentOption.NO_UPFRONT,
            0.0,
        )
    one = committed[("a2-highgpu-1g", 1)]
    assert (one.gpu_model, one.gpu_count, one.vcpus, one.ram_gib) == ("A100-40GB", 1, 12, 85.0)
    # europe-west4 and the other GPUs have no commitment SKUs here: said, never guessed
    assert any(p.startswith("committed 1-year:") and "not priced" in p for p in gcp.problems)


def test_without_commitments_the_commitment_skus_are_ignored(fake) -> None:
    offers = provider(fake).fetch_offers(["us-central1"])
    assert offers and Market.COMMITTED not in {o.market for o in offers}


def test_a_term_missing_one_sku_is_not_priced() -> None:
    pytest.importorskip("google.cloud.compute_v1")
    from tests.helpers.gcp_fake import FakeGcp

    with FakeGcp.from_recorded(DATA) as recorded:  # 1-year core and A100 only, no RAM
        gcp = provider(recorded, commitments=True)
        offers = gcp.fetch_offers(["us-central1"])
    assert Market.COMMITTED not in {o.market for o in offers}
    assert any("a2 RAM" in p for p in gcp.problems if p.startswith("committed 1-year:"))
