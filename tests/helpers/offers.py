"""Offers for tests: the one offer factory, and an offer source whose answers a test sets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from optimizer.clock import SteadyClock
from optimizer.model import Interconnect, Market, Offer

T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)  # mid-month, and in the past

# Instance types' hardware as AWS describes them (DescribeInstanceTypes), to start an offer
# of another type from: `make_offer(**P4DE_24XLARGE, ...)`.
G5_XLARGE: dict[str, Any] = {
    "instance_type": "g5.xlarge",
    "gpu_model": "A10G",
    "gpu_count": 1,
    "gpu_memory_gib": 22.35,
    "vcpus": 4,
    "ram_gib": 16.0,
    "interconnect": Interconnect.NONE,
}
G6_XLARGE = {**G5_XLARGE, "instance_type": "g6.xlarge", "gpu_model": "L4"}
P4D_24XLARGE: dict[str, Any] = {
    "instance_type": "p4d.24xlarge",
    "gpu_model": "A100-40GB",
    "gpu_count": 8,
    "gpu_memory_gib": 40.0,
    "vcpus": 96,
    "ram_gib": 1152.0,
    "interconnect": Interconnect.NVLINK,
}
P4DE_24XLARGE = {
    **P4D_24XLARGE,
    "instance_type": "p4de.24xlarge",
    "gpu_model": "A100-80GB",
    "gpu_memory_gib": 80.0,
}

BASE = Offer(
    provider="aws",
    region="us-east-1",
    zone="use1-az1",
    **G5_XLARGE,
    market=Market.SPOT,
    usd_per_hour=0.40,
    observed_at=T0,
    source="test",
)
"""One A10G on AWS spot in us-east-1 at $0.40/h, observed at T0."""


def make_offer(**changes: Any) -> Offer:
    """BASE with `changes` applied (any Offer field). A module that needs another starting
    point binds its own: `offer = functools.partial(make_offer, **MY_NODE)`; keywords given at
    the call still win."""
    return replace(BASE, **changes)


def steady_clock() -> SteadyClock:
    """A clock from five minutes after T0, moving at the wall clock's pace: for daemons that
    run real loops and servers on offers observed at T0 (the same on any day the suite runs,
    and mid-month)."""
    return SteadyClock(T0 + timedelta(minutes=5))


class FakeSource:
    """An OfferSource whose offers and failures a test sets."""

    def __init__(self, offers: Sequence[Offer] = (), name: str = "fake") -> None:
        self.name = name
        self.offers = list(offers)
        self.error: Exception | None = None
        self.problems: list[str] = []
        self.calls = 0

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        if regions is None:
            return list(self.offers)
        return [o for o in self.offers if o.region in regions]
