"""Cloud Billing Catalog SKUs → per-region unit prices → instance prices. Pure functions.

Compute Engine bills a GPU VM as vCPUs x "<Series> Instance Core" + GiB x "<Series> Instance
Ram" + GPUs x "<GPU> GPU" of the VM's region, each SKU `OnDemand` or `Preemptible` (= Spot)
(REFERENCE.md §2.3: gpuhunt `Prices.get_instance_price`, SkyPilot `fetch_gcp.py`). A SKU's
price is `pricingInfo[0].pricingExpression.tieredRates[0].unitPrice` (units + nanos / 1e9).
A SKU this module cannot read is reported with its description, never guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from optimizer import hardware
from optimizer.model import Market

# Compute Engine's service id in the catalog (https://cloud.google.com/skus; REFERENCE §2.3).
COMPUTE_SERVICE = "services/6F81-5844-456A"
SKU_PAGE_SIZE = 5000  # the API's largest page (REFERENCE §2.3)

_MARKETS = {"OnDemand": Market.ON_DEMAND, "Preemptible": Market.SPOT}
# Consumption models priced apart from plain on-demand/Spot, and licence add-ons: never a
# list price for a VM we launch (the same exclusions as gpuhunt and SkyPilot, REFERENCE §2.3).
_EXCLUDED_WORDS = (
    "custom",
    "premium",
    "sole tenancy",
    "reserved",
    "commitment",
    "dws",
    "flex-start",
    "calendar mode",
    "virtual workstation",
    "extended memory",
)
_PREFIX = re.compile(r"^(?:spot preemptible |preemptible )", re.IGNORECASE)
_LOCATION = re.compile(r"\s+(?:running\s+)?in\s+.+$", re.IGNORECASE)
_RESOURCE = re.compile(r"^(?P<name>.+?)\s+(?P<res>gpu|core|ram)$", re.IGNORECASE)
# "Nvidia B200 (1 gpu slice)": one GPU plus its share of the VM (SkyPilot prices the host at 0).
_SLICE = re.compile(r"^(?P<name>.+?)\s+\(1 gpu slice\)$", re.IGNORECASE)
# Billing spells some GPUs differently from their accelerator type (gpuhunt's aliases, and
# SkyPilot's: H100 Mega appears as "H100 80GB Mega" and "H100 80GB Plus").
_GPU_ALIASES = {
    "nvidia-tesla-a100-80gb": "nvidia-a100-80gb",
    "nvidia-h100-80gb-mega": "nvidia-h100-mega-80gb",
    "nvidia-h100-80gb-plus": "nvidia-h100-mega-80gb",
}
# Core/RAM series names in SKU descriptions → gpuopt's series key (REFERENCE §2.3; "A3Plus"
# is a3-megagpu per gpuhunt).
SERIES_NAMES = {
    "n1 predefined instance": "n1",
    "a2 instance": "a2",
    "a3 instance": "a3",
    "a3plus instance": "a3plus",
    "g2 instance": "g2",
    "a4 instance": "a4",
}
# Series prefixes of GPU machine families: a core/RAM SKU starting with one of these that is
# not in SERIES_NAMES is reported; other series (E2, N2, C3 …) are no concern of ours.
_GPU_SERIES_PREFIX = re.compile(r"^(?:n1|a2|a3|a4|a4x|g2|g4)\b")
_UNITS = {"core": "h", "ram": "GiBy.h", "gpu": "h"}


class Resource(StrEnum):
    CORE = "core"
    RAM = "ram"
    GPU = "gpu"


@dataclass(frozen=True, slots=True)
class SkuRecord:
    """The fields of one catalog SKU that pricing reads."""

    sku_id: str
    description: str
    resource_family: str
    resource_group: str
    usage_type: str
    service_regions: tuple[str, ...]
    usage_unit: str
    currency: str
    units: int
    nanos: int

    @property
    def usd(self) -> float:
        return round(self.units + self.nanos / 1e9, 9)  # nanos: the price's last digit

    @classmethod
    def from_message(cls, sku: Any) -> SkuRecord:
        """From a `google.cloud.billing_v1.Sku` (the client's message type) or its protobuf."""
        # proto-plus wraps every attribute read; the raw protobuf reads ~10x faster, which
        # matters over the catalog's thousands of SKUs (bench/gcp_poll.py).
        raw = type(sku).pb(sku) if hasattr(type(sku), "pb") else sku
        info = raw.pricing_info
        expression = info[0].pricing_expression if len(info) else None
        tiers: Any = expression.tiered_rates if expression is not None else []
        rate = tiers[0].unit_price if len(tiers) else None
        category = raw.category
        return cls(
            sku_id=raw.sku_id,
            description=raw.description,
            resource_family=category.resource_family,
            resource_group=category.resource_group,
            usage_type=category.usage_type,
            service_regions=tuple(raw.service_regions),
            usage_unit=expression.usage_unit if expression is not None else "",
            currency=rate.currency_code if rate is not None else "",
            units=int(rate.units) if rate is not None else 0,
            nanos=int(rate.nanos) if rate is not None else 0,
        )


@dataclass(frozen=True, slots=True)
class SkuRate:
    """One SKU read: the unit price of `resource` `name` in `regions`, in one market."""

    resource: Resource
    name: str  # series key (core/ram) or accelerator type (gpu)
    market: Market
    regions: tuple[str, ...]
    usd: float
    includes_host: bool = False  # a GPU slice SKU that also pays for the VM's cores and RAM


@dataclass(frozen=True, slots=True)
class Unmapped:
    """A SKU that concerns GPU VMs but could not be read; reported, never guessed."""

    sku_id: str
    description: str
    why: str

    def __str__(self) -> str:
        return f"unmapped SKU {self.sku_id} {self.description!r}: {self.why}"


def gpu_accelerator(billing_name: str) -> str | None:
    """`Nvidia Tesla A100 80GB` → `nvidia-a100-80gb`; None when the GPU is not known."""
    slug = re.sub(r"\s+", "-", billing_name.strip().lower())
    if not slug.startswith("nvidia-"):
        slug = f"nvidia-{slug}"
    slug = _GPU_ALIASES.get(slug, slug)
    return slug if hardware.from_gcp(slug).known else None


def read_sku(sku: SkuRecord) -> SkuRate | Unmapped | None:
    """The rate a SKU sets; Unmapped when it concerns GPU VMs but cannot be read; else None."""
    market = _MARKETS.get(sku.usage_type)
    if sku.resource_family != "Compute" or market is None:
        return None  # storage, network, licences; commitments (Commit1Yr …)
    text = " ".join(sku.description.split())
    lowered = text.lower()
    if any(word in lowered for word in _EXCLUDED_WORDS):
        return None
    head = _LOCATION.sub("", _PREFIX.sub("", text))
    is_gpu = sku.resource_group == "GPU" or "gpu" in head.lower()

    def unmapped(why: str) -> Unmapped:
        return Unmapped(sku.sku_id, sku.description, why)

    slice_match = _SLICE.match(head)
    match = _RESOURCE.match(head)
    if slice_match:
        resource, raw_name, includes_host = Resource.GPU, slice_match["name"], True
    elif match:
        resource, raw_name, includes_host = Resource(match["res"].lower()), match["name"], False
    else:
        return unmapped("not a GPU, core or RAM price") if is_gpu else None

    if resource is Resource.GPU:
        name = gpu_accelerator(raw_name)
        if name is None:
            return unmapped(f"GPU {raw_name!r} matches no known accelerator type")
    else:
        series = raw_name.lower()
        if series not in SERIES_NAMES:
            if _GPU_SERIES_PREFIX.match(series):
                return unmapped(f"series {raw_name!r} is not a known GPU VM series")
            return None
        name = SERIES_NAMES[series]

    if sku.usage_unit != _UNITS[resource]:
        return unmapped(f"usage unit {sku.usage_unit!r}, expected {_UNITS[resource]!r}")
    if sku.currency != "USD":
        return unmapped(f"currency {sku.currency!r}, expected USD")
    if not sku.service_regions:
        return unmapped("no service regions")
    return SkuRate(resource, name, market, sku.service_regions, sku.usd, includes_host)


@dataclass
class PriceBook:
    """Unit prices by (region, market, resource, name), built from the catalog's SKUs."""

    rates: dict[tuple[str, Market, Resource, str], float] = field(default_factory=dict)
    host_included: set[tuple[str, Market, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    _conflicts: set[tuple[str, Market, Resource, str]] = field(default_factory=set)

    def add(self, rate: SkuRate) -> None:
        for region in rate.regions:
            key = (region, rate.market, rate.resource, rate.name)
            if key in self._conflicts:
                continue
            known = self.rates.get(key)
            if known is not None and abs(known - rate.usd) > 1e-9:
                # Two SKUs price one thing differently: neither is trusted.
                del self.rates[key]
                self._conflicts.add(key)
                self.problems.append(
                    f"conflicting SKUs for {rate.resource} {rate.name} in {region} "
                    f"({rate.market}): {known} and {rate.usd}; not priced"
                )
                continue
            self.rates[key] = rate.usd
            if rate.includes_host:
                self.host_included.add((region, rate.market, rate.name))

    def rate(self, region: str, market: Market, resource: Resource, name: str) -> float | None:
        return self.rates.get((region, market, resource, name))


def build_price_book(skus: Iterable[SkuRecord]) -> PriceBook:
    """Read every SKU once; unreadable GPU-VM SKUs become problems."""
    book = PriceBook()
    seen: set[str] = set()
    for sku in skus:
        result = read_sku(sku)
        if isinstance(result, Unmapped):
            line = str(result)
            if line not in seen:
                seen.add(line)
                book.problems.append(line)
        elif result is not None:
            book.add(result)
    return book


def billing_series(machine_type: str) -> str | None:
    """The billing series whose core/RAM SKUs price a machine type; None when unknown.

    All A3 hosts but Mega bill as "A3 Instance" (SkyPilot's fetcher prices them so); Mega is
    "A3Plus Instance" (gpuhunt, REFERENCE §2.2).
    """
    family = machine_type.split("-", 1)[0]
    if machine_type.startswith("a3-megagpu-"):
        return "a3plus"
    return family if family in {"n1", "a2", "a3", "g2", "a4"} else None


@dataclass(frozen=True, slots=True)
class Quote:
    """An instance price, or what was missing to compute it."""

    usd: float | None
    missing: tuple[str, ...] = ()


def instance_price(
    book: PriceBook,
    *,
    region: str,
    market: Market,
    machine_type: str,
    vcpus: int,
    ram_gib: float,
    accelerator: str,
    gpu_count: int,
) -> Quote:
    """vCPUs x core + GiB x RAM + GPUs x GPU, all from `region` and `market`."""
    gpu = book.rate(region, market, Resource.GPU, accelerator)
    missing: list[str] = []
    if gpu is None:
        missing.append(f"{accelerator} GPU")
    if (region, market, accelerator) in book.host_included:
        host = 0.0
    else:
        series = billing_series(machine_type)
        if series is None:
            return Quote(None, (*missing, f"billing series of {machine_type}"))
        core = book.rate(region, market, Resource.CORE, series)
        ram = book.rate(region, market, Resource.RAM, series)
        if core is None:
            missing.append(f"{series} core")
        if ram is None:
            missing.append(f"{series} RAM")
        host = vcpus * core + ram_gib * ram if core is not None and ram is not None else 0.0
    if missing or gpu is None:
        return Quote(None, tuple(missing))
    return Quote(round(host + gpu_count * gpu, 6))


# --- committed use discounts ---------------------------------------------------------------
# CUD SKUs sit in the same service with usageType Commit1Yr/Commit3Yr and descriptions such as
# "Commitment v1: A2 Cpu in Americas for 1 Year", "Commitment v1: Nvidia Tesla A100 GPU in
# Americas for 3 Year" (REFERENCE-ROUND2 §4, Cyclenerd/google-cloud-pricing-cost-calculator
# build/mapping.csv). They are priced like the on-demand SKUs, per vCPU-hour, GiB-hour and
# GPU-hour, and paid every hour of the term (GCP bills them monthly: no upfront).
COMMIT_TERMS = {"Commit1Yr": 1, "Commit3Yr": 3}
_COMMITMENT = re.compile(
    r"^commitment(?: v\d+)?:\s*(?P<head>.+?)\s+in\s+.+?\s+for\s+(?P<years>\d+)\s+years?$",
    re.IGNORECASE,
)
_COMMIT_RESOURCE = re.compile(r"^(?P<name>.+?)\s+(?P<res>gpu|cpu|core|ram)$", re.IGNORECASE)


def read_commitment_sku(sku: SkuRecord) -> tuple[int, SkuRate] | Unmapped | None:
    """(term in years, the rate) of a GPU-VM commitment SKU; Unmapped when it concerns GPU
    VMs but cannot be read; None for anything else (other series, the N1 'Cpu' SKUs that
    name no series, non-commitment SKUs)."""
    term = COMMIT_TERMS.get(sku.usage_type)
    if sku.resource_family != "Compute" or term is None:
        return None
    text = " ".join(sku.description.split())
    whole = _COMMITMENT.match(text)
    part = _COMMIT_RESOURCE.match(whole["head"]) if whole else None
    is_gpu = sku.resource_group == "GPU" or " gpu " in f" {text.lower()} "

    def unmapped(why: str) -> Unmapped:
        return Unmapped(sku.sku_id, sku.description, why)

    if whole is None or part is None:
        return unmapped("not a commitment GPU, core or RAM price") if is_gpu else None
    if int(whole["years"]) != term:
        return unmapped(f"says {whole['years']} year(s) but is {sku.usage_type}")
    res = part["res"].lower()
    resource = Resource.GPU if res == "gpu" else Resource.RAM if res == "ram" else Resource.CORE
    if resource is Resource.GPU:
        name = gpu_accelerator(part["name"])
        if name is None:
            return unmapped(f"GPU {part['name']!r} matches no known accelerator type")
    else:
        series = SERIES_NAMES.get(f"{part['name'].lower()} instance")
        if series is None:
            return None
        name = series
    if sku.usage_unit != _UNITS[resource]:
        return unmapped(f"usage unit {sku.usage_unit!r}, expected {_UNITS[resource]!r}")
    if sku.currency != "USD":
        return unmapped(f"currency {sku.currency!r}, expected USD")
    if not sku.service_regions:
        return unmapped("no service regions")
    return term, SkuRate(resource, name, Market.COMMITTED, sku.service_regions, sku.usd)


def build_commitment_books(skus: Iterable[SkuRecord]) -> dict[int, PriceBook]:
    """One price book per term (1, 3), market `committed`; `instance_price` reads them as it
    reads the on-demand book. Unreadable GPU-VM commitment SKUs are problems of both."""
    books = {term: PriceBook() for term in COMMIT_TERMS.values()}
    for sku in skus:
        result = read_commitment_sku(sku)
        if isinstance(result, Unmapped):
            for book in books.values():
                book.problems.append(str(result))
        elif result is not None:
            term, rate = result
            books[term].add(rate)
    return books
