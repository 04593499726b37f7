"""On-demand list prices from the AWS Price List Query API (`pricing.get_products`).

One paginated chain per GPU instance type returns that type's Linux, shared-tenancy,
no-software, on-demand price in every region at once. Each `PriceList` element is a JSON
*string*; the hourly USD price sits at `terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`
(`aws/karpenter-provider-aws:pkg/providers/pricing/pricing.go`, REFERENCE.md §1.3).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

SERVICE_CODE = "AmazonEC2"
# The Price List Query API answers only in these regions (REFERENCE.md §1.3); China's
# cn-northwest-1 serves China prices in CNY, which this reader does not convert.
PRICING_REGIONS = frozenset({"us-east-1", "ap-south-1", "eu-central-1"})
PAGE_SIZE = 100  # GetProducts MaxResults upper bound (botocore service model)


def product_filters(instance_type: str, region: str | None = None) -> list[dict[str, str]]:
    """The TERM_MATCH filters for one type's on-demand Linux price (Karpenter's set).

    Bare-metal types are listed under dedicated tenancy (REFERENCE.md §1.3, Karpenter).
    """
    tenancy = "Dedicated" if instance_type.endswith(".metal") else "Shared"
    fields = {
        "instanceType": instance_type,
        "operatingSystem": "Linux",
        "tenancy": tenancy,
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
    }
    if region is not None:
        fields["regionCode"] = region
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


# Attribute values a row must have, checked again client-side: the filters are exact matches
# on what was asked, but capacity-block and reserved-capacity rows have turned up priced $0.
_WANTED = {
    "operatingSystem": "Linux",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "marketoption": "OnDemand",
}


def parse_price_item(item: str | dict[str, Any]) -> tuple[str, str, float] | None:
    """(instance type, region code, USD per hour) from one PriceList element, or None.

    None for rows that are not a plain on-demand hourly USD price above zero (capacity
    blocks, reservations, other currencies, other operating systems).
    """
    data = json.loads(item) if isinstance(item, str) else item
    product = data.get("product") or {}
    attrs = product.get("attributes") or {}
    instance_type = attrs.get("instanceType")
    region = attrs.get("regionCode")
    if not instance_type or not region:
        return None
    if any(k in attrs and attrs[k] != v for k, v in _WANTED.items()):
        return None
    best: float | None = None
    for term in ((data.get("terms") or {}).get("OnDemand") or {}).values():
        for dimension in (term.get("priceDimensions") or {}).values():
            if str(dimension.get("unit", "")).lower() not in ("hrs", "hours"):
                continue
            raw: Any = (dimension.get("pricePerUnit") or {}).get("USD")
            try:
                usd = float(raw)
            except (TypeError, ValueError):
                continue
            if math.isfinite(usd) and usd > 0 and (best is None or usd < best):
                best = usd
    return None if best is None else (instance_type, region, best)


def parse_price_list(items: Iterable[str | dict[str, Any]]) -> dict[tuple[str, str], float]:
    """{(instance type, region): USD per hour}; where rows repeat, the lowest price."""
    prices: dict[tuple[str, str], float] = {}
    for item in items:
        parsed = parse_price_item(item)
        if parsed is None:
            continue
        instance_type, region, usd = parsed
        key = (instance_type, region)
        if key not in prices or usd < prices[key]:
            prices[key] = usd
    return prices


def price_list(pricing: Any, instance_type: str, region: str | None = None) -> list[dict[str, Any]]:
    """Every PriceList element for one type, parsed: one paginated GetProducts chain.

    With `region` the query is narrowed to it; without, every region comes back at once. Each
    element carries the product's `terms.OnDemand` and its `terms.Reserved` (the Reserved
    Instance rates, providers/aws/commitments.py), so one chain serves both.
    """
    pages = pricing.get_paginator("get_products").paginate(
        ServiceCode=SERVICE_CODE,
        Filters=product_filters(instance_type, region),
        FormatVersion="aws_v1",
        PaginationConfig={"PageSize": PAGE_SIZE},
    )
    return [
        json.loads(item) if isinstance(item, str) else item
        for page in pages
        for item in page.get("PriceList", [])
    ]


def on_demand_from(items: Iterable[str | dict[str, Any]], instance_type: str) -> dict[str, float]:
    """{region: USD per hour} for one type from its PriceList elements."""
    return {r: usd for (t, r), usd in parse_price_list(items).items() if t == instance_type}


def on_demand_prices(
    pricing: Any, instance_type: str, region: str | None = None
) -> dict[str, float]:
    """{region: USD per hour} for one type: one paginated GetProducts chain."""
    return on_demand_from(price_list(pricing, instance_type, region), instance_type)
