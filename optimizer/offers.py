"""Filtering and ordering offers: the shared query behind `gpuopt offers` and the API."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from optimizer.model import Market, Offer


@dataclass(frozen=True, slots=True)
class OfferQuery:
    """What a user asks for; every field is optional and an empty field matches all."""

    gpu_models: tuple[str, ...] = ()  # canonical names
    min_gpu_memory_gib: float | None = None  # per GPU
    min_gpus: int | None = None
    region_globs: tuple[str, ...] = ()  # over each cloud's own region names
    providers: tuple[str, ...] = ()
    market: Market | None = None
    max_usd_per_hour: float | None = None

    def matches(self, offer: Offer) -> bool:
        if self.gpu_models and offer.gpu_model not in self.gpu_models:
            return False
        if self.min_gpu_memory_gib is not None and offer.gpu_memory_gib < self.min_gpu_memory_gib:
            return False
        if self.min_gpus is not None and offer.gpu_count < self.min_gpus:
            return False
        if self.region_globs and not any(fnmatchcase(offer.region, g) for g in self.region_globs):
            return False
        if self.providers and offer.provider not in self.providers:
            return False
        if self.market is not None and offer.market is not self.market:
            return False
        return self.max_usd_per_hour is None or offer.usd_per_hour <= self.max_usd_per_hour


def sort_key(offer: Offer) -> tuple[float, str, str, str, str, str]:
    """Cheapest first; ties broken by place and type so the order is stable."""
    return (
        offer.usd_per_hour,
        offer.provider,
        offer.region,
        offer.zone or "",
        offer.instance_type,
        offer.market.value,
    )


def select(offers: Iterable[Offer], query: OfferQuery) -> list[Offer]:
    """Offers matching the query, cheapest per hour first."""
    return sorted((o for o in offers if query.matches(o)), key=sort_key)
