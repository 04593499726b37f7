"""What a provider knows about its own cloud beyond offers: how it bills and what its
billing exports call it. Each provider's registry entry carries its own (the values, with
their sources, live in the provider's package); `optimizer/hardware.py` holds the type of its
interconnect and fabric facts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BillingRule:
    """How one provider bills an instance and its root volume."""

    minimum_s: float
    # A spot instance the cloud itself interrupts within this many seconds of its launch is
    # not charged at all (None: no such credit).
    interrupted_free_s: float | None
    disk_usd_per_gib_month: float
    disk_type: str


@dataclass(frozen=True, slots=True)
class FocusNames:
    """The names a FOCUS cost export gives the provider's charges: who bills
    (`ProviderName`, `PublisherName`, `InvoiceIssuerName`) and the services an instance and
    its root volume are (`ServiceName`)."""

    issuer: str
    compute: str
    storage: str


# A machine the team owns: its hourly TCO rate is charged per second of an attempt, with no
# minimum (no cloud bills it), and its disk costs nothing more (it is part of the capex).
OWNED_BILLING = BillingRule(
    minimum_s=0.0, interrupted_free_s=None, disk_usd_per_gib_month=0.0, disk_type="local disk"
)
