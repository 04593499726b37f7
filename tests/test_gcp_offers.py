"""GcpProvider.fetch_offers against a local fake speaking the Compute and Billing REST APIs.

The real google-cloud clients talk REST to the fake (tests/data/gcp holds its recorded
responses); every expected price below is computed by hand from the fixture's SKUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from math import ceil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")
from google.auth.credentials import AnonymousCredentials

from optimizer import hardware
from optimizer.model import Interconnect, Market, Offer
from providers.base import AuthError
from providers.gcp import GcpProvider
from providers.gcp.offers import read_machines
from providers.gcp.provider import MACHINE_FILTER
from tests.helpers.gcp_fake import FakeGcp, error_body

DATA = Path(__file__).parent / "data" / "gcp"
T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
SKUS_PATH = "/v1/services/6F81-5844-456A/skus"

# Unit prices in tests/data/gcp/skus.json (USD per vCPU-hour, GiB-hour, GPU-hour).
A2_CORE = {("us-central1", "on_demand"): 0.031611, ("us-central1", "spot"): 0.01264,
           ("europe-west4", "on_demand"): 0.034802, ("europe-west4", "spot"): 0.0136}  # fmt: skip
A2_RAM = {("us-central1", "on_demand"): 0.004237, ("us-central1", "spot"): 0.001695,
          ("europe-west4", "on_demand"): 0.004664, ("europe-west4", "spot"): 0.001824}  # fmt: skip
A100 = {("us-central1", "on_demand"): 2.933908, ("us-central1", "spot"): 1.1472,
        ("europe-west4", "on_demand"): 1.61365, ("europe-west4", "spot"): 1.1691}  # fmt: skip
N1_CORE_US, N1_RAM_US, T4_US = 0.031611, 0.004237, 0.35
N1_CORE_US_SPOT, N1_RAM_US_SPOT, T4_US_SPOT = 0.008131, 0.001042, 0.14
A3_CORE_US, A3_RAM_US, H100_MEGA_US = 0.025498, 0.0022203, 10.344276
A3_CORE_EU_SPOT, A3_RAM_EU_SPOT, H200_EU_SPOT = 0.00482, 0.00042, 3.91094
G2_CORE_US, G2_RAM_US, L4_US = 0.024988, 0.0029274, 0.56004


class MemoryCache:
    """A SpecCache in a dict."""

    def __init__(self) -> None:
        self.saved: dict[tuple[str, str], tuple[datetime, Any]] = {}

    def load_cached(self, provider: str, key: str) -> tuple[datetime, Any] | None:
        return self.saved.get((provider, key))

    def save_cached(self, provider: str, key: str, value: Any, fetched_at: datetime) -> None:
        self.saved[(provider, key)] = (fetched_at, value)


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def fake() -> Iterator[FakeGcp]:
    with FakeGcp.from_recorded(DATA) as server:
        yield server


def provider(fake: FakeGcp, **kwargs: Any) -> GcpProvider:
    kwargs.setdefault("clock", Clock())
    return GcpProvider(
        "gpuopt-test",
        client_options={"api_endpoint": fake.url},
        credentials=AnonymousCredentials(),
        transport="rest",
        **kwargs,
    )


def pick(offers: list[Offer], kind: str, zone: str, market: str) -> Offer:
    found = [o for o in offers if (o.instance_type, o.zone, o.market.value) == (kind, zone, market)]
    assert len(found) == 1, f"{kind} {zone} {market}: {found}"
    return found[0]


@pytest.fixture
def offers(fake: FakeGcp) -> list[Offer]:
    return provider(fake).fetch_offers()


@pytest.mark.parametrize("region", ["us-central1", "europe-west4"])
@pytest.mark.parametrize("market", ["on_demand", "spot"])
def test_a2_highgpu_1g_is_12_cores_85_gib_and_one_a100(offers, region, market) -> None:
    key = (region, market)
    expected = 12 * A2_CORE[key] + 85 * A2_RAM[key] + 1 * A100[key]
    offer = pick(offers, "a2-highgpu-1g", f"{region}-a", market)
    assert offer.usd_per_hour == pytest.approx(expected, abs=1e-6)
    assert (offer.vcpus, offer.ram_gib, offer.gpu_model, offer.gpu_count) == (
        12,
        85.0,
        "A100-40GB",
        1,
    )


def test_us_central1_a2_highgpu_1g_matches_the_public_list_price(offers) -> None:
    # 3.673385 USD/h: GCP's a2-highgpu-1g on-demand price in Iowa (VM + A100 40GB).
    assert pick(offers, "a2-highgpu-1g", "us-central1-a", "on_demand").usd_per_hour == 3.673385


def test_n1_host_with_an_attached_t4_is_host_plus_gpu(offers) -> None:
    kind = "n1-standard-8+nvidia-tesla-t4:1"
    on_demand = pick(offers, kind, "us-central1-a", "on_demand")
    spot = pick(offers, kind, "us-central1-a", "spot")
    assert on_demand.usd_per_hour == pytest.approx(8 * N1_CORE_US + 30 * N1_RAM_US + T4_US)
    assert spot.usd_per_hour == pytest.approx(
        8 * N1_CORE_US_SPOT + 30 * N1_RAM_US_SPOT + T4_US_SPOT
    )
    assert (on_demand.gpu_model, on_demand.vcpus, on_demand.interconnect) == (
        "T4",
        8,
        Interconnect.NONE,
    )


def test_attached_gpu_counts_respect_the_n1_limits(offers) -> None:
    kinds = {o.instance_type for o in offers if o.zone == "us-central1-a"}
    assert {"n1-standard-96+nvidia-tesla-t4:4", "n1-standard-96+nvidia-tesla-v100:8"} <= kinds
    # 96 vCPUs exceed the 1-2 T4 and 1-4 V100 limits (48 and 48 vCPUs at most).
    assert "n1-standard-96+nvidia-tesla-t4:2" not in kinds
    assert "n1-standard-96+nvidia-tesla-v100:4" not in kinds
    assert "n1-highmem-8+nvidia-tesla-v100:1" in kinds  # 8 vCPUs, 52 GiB: within 12 / 78
    four = pick(offers, "n1-standard-8+nvidia-tesla-t4:4", "us-central1-a", "on_demand")
    assert four.interconnect is Interconnect.PCIE and four.gpu_count == 4


def test_g2_standard_24_carries_two_l4(offers) -> None:
    offer = pick(offers, "g2-standard-24", "us-central1-a", "on_demand")
    assert offer.usd_per_hour == pytest.approx(24 * G2_CORE_US + 96 * G2_RAM_US + 2 * L4_US)
    assert (offer.gpu_model, offer.gpu_count) == ("L4", 2)
    assert offer.gpu_memory_gib == hardware.get("L4").memory_gib  # GCP states no GPU memory


def test_h100_mega_is_priced_from_the_a3plus_and_mega_gpu_skus(offers) -> None:
    offer = pick(offers, "a3-megagpu-8g", "us-central1-a", "on_demand")
    expected = 208 * A3_CORE_US + 1872 * A3_RAM_US + 8 * H100_MEGA_US
    assert offer.usd_per_hour == pytest.approx(expected, abs=1e-6)
    assert (offer.gpu_model, offer.interconnect) == ("H100-80GB", Interconnect.NVLINK)


def test_spot_only_machine_types_have_no_on_demand_offer(offers) -> None:
    markets = {(o.instance_type, o.market) for o in offers}
    assert ("a3-highgpu-1g", Market.SPOT) in markets
    assert ("a3-highgpu-1g", Market.ON_DEMAND) not in markets
    assert ("a3-highgpu-8g", Market.ON_DEMAND) in markets
    h200 = pick(offers, "a3-ultragpu-8g", "europe-west4-a", "spot")
    expected = 224 * A3_CORE_EU_SPOT + 2952 * A3_RAM_EU_SPOT + 8 * H200_EU_SPOT
    assert h200.usd_per_hour == pytest.approx(expected, abs=1e-6)
    assert ("a3-ultragpu-8g", Market.ON_DEMAND) not in markets


def test_spot_above_on_demand_is_flagged_and_dropped(fake) -> None:
    gcp = provider(fake)
    offers = gcp.fetch_offers()
    tokyo = {
        o.market
        for o in offers
        if o.instance_type == "a3-highgpu-8g" and o.region == "asia-northeast1"
    }
    assert tokyo == {Market.ON_DEMAND}
    flagged = [p for p in gcp.problems if "asia-northeast1 a3-highgpu-8g" in p]
    assert len(flagged) == 1 and "above on-demand" in flagged[0] and "dropped" in flagged[0]


def test_spot_above_on_demand_can_be_kept_when_asked(fake) -> None:
    gcp = provider(fake, keep_spot_above_on_demand=True)
    offers = gcp.fetch_offers(["asia-northeast1"])
    spot = pick(offers, "a3-highgpu-8g", "asia-northeast1-a", "spot")
    on_demand = pick(offers, "a3-highgpu-8g", "asia-northeast1-a", "on_demand")
    assert spot.usd_per_hour > on_demand.usd_per_hour
    assert any("kept" in p for p in gcp.problems)


def test_unmappable_skus_and_unpriced_types_are_reported_not_guessed(fake) -> None:
    gcp = provider(fake)
    offers = gcp.fetch_offers()
    assert any("'Nvidia Tesla K80 GPU running in Americas'" in p for p in gcp.problems)
    assert any("g4-standard-48" in p and "no billing series" in p for p in gcp.problems)
    assert not [o for o in offers if o.instance_type.startswith("g4-")]


def test_workstation_gpus_and_plain_machine_types_are_not_offered(offers) -> None:
    assert not [o for o in offers if "vws" in o.instance_type or o.instance_type.startswith("e2-")]


def test_every_offer_is_zonal_sourced_and_canonically_named(offers) -> None:
    assert offers and all(o.zone and o.zone.startswith(o.region + "-") for o in offers)
    assert {o.source for o in offers} == {"gcp-billing"}
    assert {o.provider for o in offers} == {"gcp"}
    assert {o.gpu_model for o in offers} == {
        "T4", "V100-16GB", "P100", "L4", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB",
    }  # fmt: skip
    eight = pick(offers, "a2-highgpu-8g", "us-central1-a", "on_demand")
    assert (eight.interconnect, eight.gpu_memory_gib) == (Interconnect.NVLINK, 40)
    assert all(o.observed_at == T0 for o in offers)


def test_regions_narrow_the_offers_but_skus_are_fetched_once(fake) -> None:
    gcp = provider(fake, regions=["us-central1"])
    assert {o.region for o in gcp.fetch_offers()} == {"us-central1"}
    assert {o.region for o in gcp.fetch_offers(["europe-west4"])} == {"europe-west4"}
    assert len(fake.calls("GET", SKUS_PATH)) == 2  # one listing per refresh, not per region


def test_a_region_without_gpu_zones_is_reported(fake) -> None:
    gcp = provider(fake)
    assert gcp.fetch_offers(["europe-north2"]) == []
    assert gcp.problems[-1] == "europe-north2: no zone lists GPU machine types; nothing offered"


def test_aggregated_lists_and_skus_are_read_page_by_page() -> None:
    with FakeGcp.from_recorded(DATA, page_size=4, sku_page_size=25) as fake:
        offers = provider(fake).fetch_offers()
        accelerators = sum(len(v) for v in fake.accelerator_types.values())
        machines = sum(len(v) for v in fake.machine_types.values())
        acc_calls = fake.calls("GET", "/aggregated/acceleratorTypes")
        machine_calls = fake.calls("GET", "/aggregated/machineTypes")
        sku_calls = fake.calls("GET", SKUS_PATH)
        assert len(acc_calls) == ceil(accelerators / 4)
        assert len(machine_calls) == ceil(machines / 4)
        assert len(sku_calls) == ceil(len(fake.skus["6F81-5844-456A"]) / 25)
    assert [c.query.get("pageToken") for c in sku_calls] == [None, "25", "50", "75", "100"]
    assert machine_calls[0].query["filter"] == MACHINE_FILTER
    assert machine_calls[0].query["maxResults"] == "500"
    assert sku_calls[0].query["currencyCode"] == "USD"
    # The zone seen only on the last machine-type page still yields offers.
    assert {o.zone for o in offers} >= {"asia-northeast1-a", "us-central1-b", "europe-west4-b"}


def test_specs_are_cached_for_a_day_and_prices_fetched_every_time(fake) -> None:
    clock, cache = Clock(), MemoryCache()
    gcp = provider(fake, clock=clock, cache=cache)
    first = gcp.fetch_offers()
    clock.now = T0 + timedelta(hours=23)
    second = gcp.fetch_offers()
    assert len(first) == len(second)
    assert len(fake.calls("GET", "/aggregated/machineTypes")) == 1
    assert len(fake.calls("GET", SKUS_PATH)) == 2
    assert cache.saved[("gcp", "zone-specs")][0] == T0
    clock.now = T0 + timedelta(hours=24, seconds=1)
    gcp.fetch_offers()
    assert len(fake.calls("GET", "/aggregated/acceleratorTypes")) == 2
    assert cache.saved[("gcp", "zone-specs")][0] == clock.now


def test_a_new_provider_reads_specs_from_the_store(fake, store) -> None:
    provider(fake, cache=store.prices).fetch_offers()
    fake.requests.clear()
    later = Clock(T0 + timedelta(hours=2))
    offers = provider(fake, cache=store.prices, clock=later).fetch_offers()
    assert offers and not fake.calls("GET", "/aggregated/")
    assert len(fake.calls("GET", SKUS_PATH)) == 1


def test_a_failed_spec_refresh_keeps_the_cached_specs_with_a_problem(fake) -> None:
    clock, cache = Clock(), MemoryCache()
    provider(fake, clock=clock, cache=cache).fetch_offers()
    clock.now = T0 + timedelta(days=2)
    body = error_body(403, "Required 'compute.machineTypes.list' permission", "forbidden")
    fake.fail_next("GET", "/aggregated/machineTypes", 403, body)
    gcp = provider(fake, clock=clock, cache=cache)
    assert gcp.fetch_offers()
    assert any("not refreshed" in p and T0.isoformat() in p for p in gcp.problems)


def test_a_rejected_billing_call_raises_auth_error(fake) -> None:
    body = error_body(
        403, "Cloud Billing API has not been used in project 1", "accessNotConfigured"
    )
    fake.fail_next("GET", SKUS_PATH, 403, body)
    with pytest.raises(AuthError, match="Cloud Billing API"):
        provider(fake).fetch_offers()


def test_deprecated_machine_types_are_skipped() -> None:
    from google.cloud import compute_v1

    live = compute_v1.MachineType(
        name="a2-highgpu-1g",
        guest_cpus=12,
        memory_mb=87040,
        accelerators=[
            compute_v1.Accelerators(
                guest_accelerator_type="nvidia-tesla-a100", guest_accelerator_count=1
            )
        ],
    )
    gone = compute_v1.MachineType(
        name="n1-highmem-2",
        guest_cpus=2,
        memory_mb=13312,
        deprecated=compute_v1.DeprecationStatus(state="OBSOLETE"),
    )
    scoped = compute_v1.MachineTypesScopedList(machine_types=[live, gone])
    specs = read_machines([("zones/us-central1-a", scoped)])
    assert [m.name for m in specs["us-central1-a"]] == ["a2-highgpu-1g"]
