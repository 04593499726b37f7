"""The domain values every layer shares: markets, interconnects and the immutable Offer."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class Market(StrEnum):
    """How an instance is bought."""

    SPOT = "spot"
    ON_DEMAND = "on_demand"


class Interconnect(StrEnum):
    """The GPU-to-GPU link inside one instance."""

    NONE = "none"  # a single GPU, nothing to connect
    PCIE = "pcie"  # GPUs talk through the PCIe host bridge only
    NVLINK = "nvlink"  # NVLink bridges or an NVSwitch fabric
    INFINITY_FABRIC = "infinity_fabric"  # AMD's GPU-to-GPU link


class OfferError(ValueError):
    """An Offer field holds a value that cannot be right."""


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise OfferError("observed_at must be timezone-aware (UTC)")
    return value.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class Offer:
    """One purchasable instance type in one place and market, priced at one moment.

    `zone` is None where the cloud prices per region (on-demand, GCP spot). GPU memory
    is per GPU. `source` says where the price came from (e.g. `aws-api`, `snapshot`,
    `simulated`) so a simulated price is never mistaken for a quoted one.
    """

    provider: str
    region: str
    zone: str | None
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gib: float
    vcpus: int
    ram_gib: float
    interconnect: Interconnect
    market: Market
    usd_per_hour: float
    observed_at: datetime
    placement_score: float | None = None
    interruption_bucket: str | None = None
    source: str = field(default="")

    def __post_init__(self) -> None:
        # Coerce the enums and times so rows read from text compare equal to built ones.
        object.__setattr__(self, "market", Market(self.market))
        object.__setattr__(self, "interconnect", Interconnect(self.interconnect))
        object.__setattr__(self, "observed_at", _utc(self.observed_at))
        for name in ("provider", "region", "instance_type", "gpu_model"):
            if not getattr(self, name):
                raise OfferError(f"{name} must not be empty")
        if self.zone == "":
            object.__setattr__(self, "zone", None)
        if self.gpu_count < 0:
            raise OfferError(f"gpu_count must be >= 0, got {self.gpu_count}")
        if self.vcpus < 0:
            raise OfferError(f"vcpus must be >= 0, got {self.vcpus}")
        for name in ("gpu_memory_gib", "ram_gib", "usd_per_hour"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise OfferError(f"{name} must be a finite number >= 0, got {value}")
        if self.placement_score is not None and not 0 <= self.placement_score <= 10:
            raise OfferError(f"placement_score must be within 0..10, got {self.placement_score}")

    @property
    def pool(self) -> tuple[str, str, str | None, str, Market]:
        """The capacity pool this offer prices: (provider, region, zone, type, market)."""
        return (self.provider, self.region, self.zone, self.instance_type, self.market)

    @property
    def total_gpu_memory_gib(self) -> float:
        return self.gpu_memory_gib * self.gpu_count

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpu_count if self.gpu_count else math.inf

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, in field order."""
        out = asdict(self)
        out["market"] = self.market.value
        out["interconnect"] = self.interconnect.value
        out["observed_at"] = self.observed_at.isoformat().replace("+00:00", "Z")
        return out


OFFER_FIELDS: tuple[str, ...] = tuple(Offer.__dataclass_fields__)
