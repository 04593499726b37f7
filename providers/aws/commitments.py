"""AWS commitment rates: Reserved Instances from the Price List, Savings Plans from their API.

Reserved Instances: `pricing.get_products` returns, beside `terms.OnDemand`, the product's
`terms.Reserved[<sku>.<offerTermCode>]`, each with `termAttributes` (`LeaseContractLength`
`1yr`/`3yr`, `OfferingClass` `standard`/`convertible`, `PurchaseOption` `No Upfront`/
`Partial Upfront`/`All Upfront`) and price dimensions: an `Hrs` hourly fee and, with an
upfront, a `Quantity` one ("Upfront Fee") (REFERENCE-ROUND2 §3a, from
`lyft/awspricing:tests/data/ec2_offer.py`, a copy of an AmazonEC2 offer file). Effective
hourly = upfront ÷ term hours + hourly.

Savings Plans: `savingsplans.describe_savings_plans_offering_rates` answers `searchResults`
of `{savingsPlanOffering{paymentOption, planType, durationSeconds, currency}, rate, unit,
usageType, operation, properties[{name, value}]}` (REFERENCE-ROUND2 §3b, botocore's
savingsplans 2019-06-28 model). The rate is what an hour of covered usage costs under the
plan; a plan paid all upfront prepays it for every hour of the term, and a partial-upfront
plan half of it (AWS asks for at least half; the split is the buyer's, so half is assumed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from optimizer.model import HOURS_PER_YEAR, Market, Offer, PaymentOption
from providers.aws.pricing import SERVICE_CODE, price_list

_TERMS = {"1yr": 1, "3yr": 3}
_PAYMENT = {
    "No Upfront": PaymentOption.NO_UPFRONT,
    "Partial Upfront": PaymentOption.PARTIAL_UPFRONT,
    "All Upfront": PaymentOption.ALL_UPFRONT,
}
_SECONDS_PER_YEAR = 365 * 24 * 3600  # durationSeconds: 31,536,000 (1 year), 94,608,000 (3)
# The Linux/UNIX, shared-tenancy rate: Linux's RunInstances operation (other operating
# systems carry a suffix, RunInstances:0002 …).
_LINUX_OPERATION = "RunInstances"
_PLAN_TYPES = ("EC2Instance", "Compute")
SAVINGS_PLANS_PAGE_SIZE = 1000  # maxResults upper bound (REFERENCE-ROUND2 §3b)
# The Savings Plans API has one global endpoint, savingsplans.amazonaws.com (REFERENCE-ROUND2
# §3b); its client is made for this region.
SAVINGS_PLANS_REGION = "us-east-1"
RESERVED = "reserved standard"


@dataclass(frozen=True, slots=True)
class Rate:
    """One commitment's price for one instance type in one region."""

    instance_type: str
    region: str
    term_years: int
    payment_option: PaymentOption
    effective_usd_per_hour: float
    upfront_usd: float
    kind: str  # "reserved standard", "savings plan EC2Instance" …


def encode_rates(rates: Iterable[Rate]) -> list[dict[str, Any]]:
    """Rates as JSON-able rows, for the SpecCache."""
    return [{**asdict(r), "payment_option": r.payment_option.value} for r in rates]


def decode_rates(rows: Any) -> list[Rate]:
    """Rates back from `encode_rates` rows; rows that do not read are dropped."""
    out = []
    for row in rows if isinstance(rows, list) else []:
        try:
            out.append(Rate(**{**row, "payment_option": PaymentOption(row["payment_option"])}))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _usd(dimension: dict[str, Any]) -> float | None:
    try:
        raw: Any = (dimension.get("pricePerUnit") or {}).get("USD")
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def parse_reserved_item(item: str | dict[str, Any]) -> list[Rate]:
    """The Reserved Instance rates of one PriceList element (Linux, shared, no software)."""
    data = json.loads(item) if isinstance(item, str) else item
    attrs = (data.get("product") or {}).get("attributes") or {}
    instance_type, region = attrs.get("instanceType"), attrs.get("regionCode")
    if not instance_type or not region:
        return []
    if (
        attrs.get("operatingSystem", "Linux") != "Linux"
        or attrs.get("preInstalledSw", "NA") != "NA"
    ):
        return []
    out = []
    for term in ((data.get("terms") or {}).get("Reserved") or {}).values():
        terms = term.get("termAttributes") or {}
        years = _TERMS.get(terms.get("LeaseContractLength", ""))
        option = _PAYMENT.get(terms.get("PurchaseOption", ""))
        if years is None or option is None:
            continue
        hourly = upfront = 0.0
        readable = True
        for dimension in (term.get("priceDimensions") or {}).values():
            usd = _usd(dimension)
            unit = str(dimension.get("unit", "")).lower()
            if usd is None:
                readable = False
            elif unit in ("hrs", "hours"):
                hourly += usd
            elif unit == "quantity":
                upfront += usd
        if not readable:
            continue
        hours = HOURS_PER_YEAR * years
        out.append(
            Rate(
                instance_type,
                region,
                years,
                option,
                round(upfront / hours + hourly, 6),
                upfront,
                f"reserved {terms.get('OfferingClass', 'standard')}",
            )
        )
    return out


def reserved_from(items: Iterable[str | dict[str, Any]], instance_type: str) -> list[Rate]:
    """The standard Reserved Instance rates of one type among PriceList elements. Convertible
    ones are left out: they cost more for the right to exchange, which a TCO does not price."""
    return [
        rate
        for item in items
        for rate in parse_reserved_item(item)
        if rate.instance_type == instance_type and rate.kind == RESERVED
    ]


def reserved_rates(pricing: Any, instance_type: str, region: str | None = None) -> list[Rate]:
    """Every standard Reserved Instance rate for one type: one paginated GetProducts chain
    (the on-demand product carries its Reserved terms)."""
    return reserved_from(price_list(pricing, instance_type, region), instance_type)


def parse_offering_rates(results: Iterable[dict[str, Any]]) -> list[Rate]:
    """Savings Plans rates from `searchResults`: USD, hourly, Linux/UNIX and shared only."""
    out = []
    for result in results:
        offering = result.get("savingsPlanOffering") or {}
        props = {p.get("name"): p.get("value") for p in result.get("properties") or []}
        option = _PAYMENT.get(offering.get("paymentOption", ""))
        seconds = offering.get("durationSeconds") or 0
        years = round(seconds / _SECONDS_PER_YEAR) if seconds else 0
        if option is None or years not in (1, 3) or offering.get("currency", "USD") != "USD":
            continue
        if result.get("unit") != "Hrs" or result.get("operation") != _LINUX_OPERATION:
            continue
        if props.get("tenancy", "shared") != "shared":
            continue
        try:
            rate = float(result.get("rate", ""))
        except ValueError:
            continue
        instance_type, region = props.get("instanceType"), props.get("region")
        if not instance_type or not region or not math.isfinite(rate) or rate < 0:
            continue
        prepaid = {PaymentOption.ALL_UPFRONT: 1.0, PaymentOption.PARTIAL_UPFRONT: 0.5}
        upfront = rate * HOURS_PER_YEAR * years * prepaid.get(option, 0.0)
        out.append(
            Rate(
                instance_type,
                region,
                years,
                option,
                rate,
                upfront,
                f"savings plan {offering.get('planType', '')}".strip(),
            )
        )
    return out


def savings_plan_rates(client: Any, instance_type: str, region: str | None = None) -> list[Rate]:
    """EC2 Instance and Compute Savings Plans rates for one type: in one region, or in every
    region at once without `region` (one paged chain either way)."""
    out: list[Rate] = []
    token: str | None = None
    filters = [{"name": "instanceType", "values": [instance_type]}]
    if region is not None:
        filters.append({"name": "region", "values": [region]})
    filters += [
        {"name": "tenancy", "values": ["shared"]},
        {"name": "productDescription", "values": ["Linux/UNIX"]},
    ]
    while True:
        kwargs: dict[str, Any] = {
            "savingsPlanTypes": list(_PLAN_TYPES),
            "products": ["EC2"],
            "serviceCodes": [SERVICE_CODE],
            "filters": filters,
            "maxResults": SAVINGS_PLANS_PAGE_SIZE,
        }
        if token:
            kwargs["nextToken"] = token
        page = client.describe_savings_plans_offering_rates(**kwargs)
        out.extend(parse_offering_rates(page.get("searchResults", [])))
        token = page.get("nextToken")
        if not token:
            return out


def committed_offers(on_demand: Iterable[Offer], rates: Iterable[Rate]) -> list[Offer]:
    """One committed Offer per rate whose type and region have an on-demand offer (which
    gives the instance's specs); the rate's kind goes in `source`."""
    specs = {(o.instance_type, o.region): o for o in on_demand if o.market is Market.ON_DEMAND}
    out = []
    for rate in rates:
        spec = specs.get((rate.instance_type, rate.region))
        if spec is None:
            continue
        out.append(
            replace(
                spec,
                zone=None,
                market=Market.COMMITTED,
                usd_per_hour=rate.effective_usd_per_hour,
                term_years=rate.term_years,
                payment_option=rate.payment_option,
                upfront_usd=rate.upfront_usd,
                source=f"aws {rate.kind}",
            )
        )
    return out
