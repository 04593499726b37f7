"""The ledger as a FinOps FOCUS 1.1 dataset, so FinOps tools import it as they import a bill.

Each cost line (one attempt in one month) gives a `Usage` row for the instance and, when it
had a root volume, one for the volume. What gpuopt cannot know it says plainly:
- BillingAccountId is the account the caller names (default `gpuopt:<provider>`): gpuopt does
  not read the cloud account a launch used.
- ListCost is the on-demand baseline for the instance row (the list price over the same
  seconds); where no on-demand price was known it is the billed cost.
- ContractedCost and EffectiveCost equal BilledCost: gpuopt knows no negotiated rates, and no
  commitment is amortized here.
- A spot instance the cloud interrupted inside its free window bills 0, with the credit named
  in ChargeDescription.
gpuopt's own facts ride in custom columns (`x_` prefix, after the FOCUS columns) and in Tags.
Column rules: FOCUS_Spec v1.1 (6108d40), specification/columns/*.md and attributes/*.md.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from optimizer.clock import utc_text
from optimizer.costs.lines import CHECKPOINT_STORAGE, INSTANCE, WARM_SPARE, Line
from providers import registry

FOCUS_VERSION = "1.1"

COLUMNS: tuple[str, ...] = (
    # FOCUS columns: the 21 Mandatory ones, then what gpuopt can fill of the others.
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
    "AvailabilityZone",
    "ChargeFrequency",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ListUnitPrice",
    "PricingCategory",
    "RegionId",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceSubcategory",
    "SkuId",
    "Tags",
    # gpuopt's own
    "x_Job",
    "x_Policy",
    "x_Attempt",
    "x_OnDemandCost",
    "x_OverheadCost",
    "x_OverheadSeconds",
)


def focus_datetime(at: datetime) -> str:
    """FOCUS Date/Time: UTC, ISO 8601 extended with a Z (`YYYY-MM-DDTHH:mm:ssZ`)."""
    return utc_text(at, timespec="seconds")


def focus_number(value: float) -> str:
    """FOCUS Numeric: a plain decimal, no sign for positives, no exponent, no symbols."""
    text = f"{value:.10f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _charge_period(line: Line) -> tuple[datetime, datetime]:
    start = max(line.launched, line.period_start)
    seconds = line.cost.billed_seconds
    if seconds <= 0 and line.ended is not None:  # credited: the time it ran
        seconds = max((min(line.ended, line.period_end) - start).total_seconds(), 0.0)
    return start, min(start + timedelta(seconds=seconds), line.period_end)


# The services that bill a job's state, by provider (the names on their own bills): object
# storage for checkpoints at rest, data transfer for what a restore moved. A provider not
# listed uses its registry entry's storage and compute names.
STATE_SERVICES: dict[str, tuple[str, str]] = {
    "aws": ("Amazon Simple Storage Service", "AWS Data Transfer"),
    "gcp": ("Cloud Storage", "Networking"),
}


def rows(lines: Iterable[Line], *, account: str | None = None) -> Iterator[dict[str, Any]]:
    """FOCUS rows (None = null) for `lines`, instance first then volume, in line order; a
    line of a job's state (optimizer/costs/state_lines.py) gives one Storage or Networking
    row."""
    for line in lines:
        if line.kind != INSTANCE:
            yield state_row(line, account=account)
            continue
        # Who bills, and the services' own names: the provider's registry entry declares them.
        names = registry.get(line.provider).focus_names()
        issuer, compute, storage = names.issuer, names.compute, names.storage
        start, end = _charge_period(line)
        hours = (end - start).total_seconds() / 3600
        tags = {
            "gpuopt/job": line.job,
            "gpuopt/policy": line.policy,
            "gpuopt/attempt": line.attempt,
            "gpuopt/market": line.market,
        }
        spare = ""
        if line.role == WARM_SPARE:  # a job's warm spare idling beside its attempt
            tags["gpuopt/role"] = line.role
            spare = " (warm spare)"
        c = line.cost
        base = {
            "BillingAccountId": account or f"gpuopt:{line.provider}",
            "BillingAccountName": None,
            "BillingCurrency": "USD",
            "BillingPeriodStart": focus_datetime(line.period_start),
            "BillingPeriodEnd": focus_datetime(line.period_end),
            "ChargeCategory": "Usage",
            "ChargeClass": None,
            "ChargePeriodStart": focus_datetime(start),
            "ChargePeriodEnd": focus_datetime(end),
            "InvoiceIssuerName": issuer,
            "ProviderName": issuer,
            "PublisherName": issuer,
            "ChargeFrequency": "Usage-Based",
            "AvailabilityZone": line.zone,
            "RegionId": line.region,
            "PricingCategory": _pricing_category(line.market),
            "Tags": json.dumps(tags, sort_keys=True),
            "x_Job": line.job,
            "x_Policy": line.policy,
            "x_Attempt": str(line.attempt),
        }
        resource = line.instance_id or f"{line.job}/{line.attempt}"
        list_cost = c.on_demand_usd if c.baseline_known else c.spend_usd
        credit = " (interrupted by the cloud in its free window: not charged)" if c.refunded else ""
        yield base | {
            "BilledCost": focus_number(c.spend_usd),
            "ContractedCost": focus_number(c.spend_usd),
            "EffectiveCost": focus_number(c.spend_usd),
            "ListCost": focus_number(list_cost),
            "ListUnitPrice": focus_number(list_cost / hours) if hours > 0 else None,
            "ChargeDescription": (
                f"{line.instance_type} {line.market.replace('_', '-')} instance{spare}{credit}"
            ),
            "PricingQuantity": focus_number(hours),
            "PricingUnit": "Hours",
            "ConsumedQuantity": focus_number(hours) if hours > 0 else None,
            "ConsumedUnit": "Hours" if hours > 0 else None,
            "ServiceCategory": "Compute",
            "ServiceSubcategory": "Virtual Machines",
            "ServiceName": compute,
            "ResourceId": resource,
            "ResourceName": f"{line.job} attempt {line.attempt}{spare}",
            "ResourceType": "Virtual Machine",
            "SkuId": line.instance_type,
            "x_OnDemandCost": focus_number(c.on_demand_usd) if c.baseline_known else None,
            "x_OverheadCost": focus_number(c.overhead_usd),
            "x_OverheadSeconds": focus_number(c.overhead_seconds),
        }
        if c.storage_usd > 0:
            yield base | {
                "BilledCost": focus_number(c.storage_usd),
                "ContractedCost": focus_number(c.storage_usd),
                "EffectiveCost": focus_number(c.storage_usd),
                "ListCost": focus_number(c.storage_usd),
                "ListUnitPrice": None,
                "ChargeDescription": f"root volume of {line.instance_type}",
                "PricingQuantity": focus_number(hours),
                "PricingUnit": "Hours",
                "ConsumedQuantity": focus_number(hours) if hours > 0 else None,
                "ConsumedUnit": "Hours" if hours > 0 else None,
                "PricingCategory": "Standard",
                "ServiceCategory": "Storage",
                "ServiceSubcategory": "Block Storage",
                "ServiceName": storage,
                "ResourceId": f"{resource}/root-volume",
                "ResourceName": f"{line.job} attempt {line.attempt} root volume",
                "ResourceType": "Volume",
                "SkuId": None,
                "x_OnDemandCost": None,
                "x_OverheadCost": None,
                "x_OverheadSeconds": None,
            }


def state_row(line: Line, *, account: str | None = None) -> dict[str, Any]:
    """The FOCUS row of a state line: a checkpoint at rest (Storage, GB-Months) or the data
    a restore moved (Networking, GB)."""
    names = registry.get(line.provider).focus_names()
    storage, network = STATE_SERVICES.get(line.provider, (names.storage, names.compute))
    stored = line.kind == CHECKPOINT_STORAGE
    usd = line.cost.total_usd
    unit = "GB-Months" if stored else "GB"
    start = max(line.launched, line.period_start)
    end = min(line.ended or line.period_end, line.period_end) if stored else start
    if stored and line.ended is None:
        end = min(start + timedelta(seconds=line.cost.billed_seconds), line.period_end)
    tags = {"gpuopt/job": line.job, "gpuopt/policy": line.policy, "gpuopt/kind": line.kind}
    return {
        "BilledCost": focus_number(usd),
        "BillingAccountId": account or f"gpuopt:{line.provider}",
        "BillingAccountName": None,
        "BillingCurrency": "USD",
        "BillingPeriodEnd": focus_datetime(line.period_end),
        "BillingPeriodStart": focus_datetime(line.period_start),
        "ChargeCategory": "Usage",
        "ChargeClass": None,
        "ChargeDescription": (
            f"checkpoint {line.resource} at rest" if stored else f"restore of {line.resource}"
        ),
        "ChargePeriodEnd": focus_datetime(end),
        "ChargePeriodStart": focus_datetime(start),
        "ContractedCost": focus_number(usd),
        "EffectiveCost": focus_number(usd),
        "InvoiceIssuerName": names.issuer,
        "ListCost": focus_number(usd),
        "PricingQuantity": focus_number(line.quantity),
        "PricingUnit": unit,
        "ProviderName": names.issuer,
        "PublisherName": names.issuer,
        "ServiceCategory": "Storage" if stored else "Networking",
        "ServiceName": storage if stored else network,
        "AvailabilityZone": None,
        "ChargeFrequency": "Usage-Based",
        "ConsumedQuantity": focus_number(line.quantity),
        "ConsumedUnit": unit,
        "ListUnitPrice": focus_number(usd / line.quantity) if line.quantity > 0 else None,
        "PricingCategory": "Standard",
        "RegionId": line.region or None,
        "ResourceId": line.resource,
        "ResourceName": line.resource,
        "ResourceType": "Object Storage" if stored else "Data Transfer",
        "ServiceSubcategory": "Object Storage" if stored else "Other (Networking)",
        "SkuId": None,
        "Tags": json.dumps(tags, sort_keys=True),
        "x_Job": line.job,
        "x_Policy": line.policy,
        "x_Attempt": None,
        "x_OnDemandCost": None,
        "x_OverheadCost": None,
        "x_OverheadSeconds": None,
    }


def write_csv(lines: Iterable[Line], *, account: str | None = None) -> str:
    """The FOCUS dataset as CSV text: a header of COLUMNS, nulls as empty fields."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows(lines, account=account):
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return out.getvalue()


def _pricing_category(market: str) -> str:
    """FOCUS 1.x PricingCategory: `Dynamic` for spot (interruptible, a moving price). An owned
    machine is `Other`: FOCUS's `Committed` means a commitment discount was applied (and asks
    for the CommitmentDiscount columns), which an owned machine's TCO rate is not; `Standard`
    is a provider's list price, which no provider publishes for it. Everything else
    (on-demand, and committed rates already effective in usd_per_hour) stays `Standard`."""
    if market == "spot":
        return "Dynamic"
    if market == "owned":
        return "Other"
    return "Standard"
