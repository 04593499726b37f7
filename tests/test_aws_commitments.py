"""AWS commitment rates against botocore's Stubber (requests and responses checked against the
service models): Reserved Instance terms from `pricing.get_products`, Savings Plans rates
from `savingsplans.describe_savings_plans_offering_rates`; effective prices by hand."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from optimizer.model import Interconnect, Market, Offer, PaymentOption
from providers.aws import commitments as C
from providers.aws import pricing as P
from tests.helpers.aws import StubSession, price_item


def reserved(
    code: str,
    length: str,
    option: str,
    hourly: float,
    upfront: float | None,
    offering: str = "standard",
) -> dict[str, Any]:
    """One `terms.Reserved` entry in the offer file's shape (REFERENCE-ROUND2 §3a)."""
    dims: dict[str, Any] = {
        f"SKU.{code}.6YS6EN2CT7": {
            "unit": "Hrs",
            "pricePerUnit": {"USD": f"{hourly:.10f}"},
            "description": "USD per instance-hour used this month",
            "beginRange": "0",
            "endRange": "Inf",
        }
    }
    if upfront is not None:
        dims[f"SKU.{code}.2TG2D8R56U"] = {
            "unit": "Quantity",
            "pricePerUnit": {"USD": f"{upfront:g}"},
            "description": "Upfront Fee",
        }
    return {
        "offerTermCode": code,
        "sku": "SKU",
        "effectiveDate": "2026-11-01T00:00:00Z",
        "priceDimensions": dims,
        "termAttributes": {
            "LeaseContractLength": length,
            "OfferingClass": offering,
            "PurchaseOption": option,
        },
    }


def with_reserved(item: str, *terms: dict[str, Any]) -> str:
    data = json.loads(item)
    data["terms"]["Reserved"] = {f"SKU.{t['offerTermCode']}": t for t in terms}
    return json.dumps(data)


def test_reserved_terms_become_effective_hourly_rates() -> None:
    session = StubSession()
    pricing = session.stub("pricing")
    item = with_reserved(
        price_item("p5.48xlarge", "us-east-1", 55.04),
        reserved("4NA7Y494T4", "1yr", "No Upfront", 38.0, None),
        # 157,680 upfront over 8,760 h is $18/h, plus $18.50/h: $36.50 effective
        reserved("HU7G6KETJZ", "1yr", "Partial Upfront", 18.5, 157_680),
        # 735,840 upfront over 26,280 h: $28/h, no hourly fee
        reserved("MZU6U2429S", "3yr", "All Upfront", 0.0, 735_840),
        reserved("7NE97W5U4E", "3yr", "No Upfront", 33.0, None, offering="convertible"),
    )
    pricing.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": [item]},
        {
            "ServiceCode": "AmazonEC2",
            "Filters": P.product_filters("p5.48xlarge", "us-east-1"),
            "FormatVersion": "aws_v1",
            "MaxResults": 100,
        },
    )
    rates = C.reserved_rates(session.client("pricing", "us-east-1"), "p5.48xlarge", "us-east-1")
    session.assert_done()
    got = {
        (r.term_years, r.payment_option): (r.effective_usd_per_hour, r.upfront_usd) for r in rates
    }
    assert got == {
        (1, PaymentOption.NO_UPFRONT): (38.0, 0.0),
        (1, PaymentOption.PARTIAL_UPFRONT): (36.5, 157_680.0),
        (3, PaymentOption.ALL_UPFRONT): (28.0, 735_840.0),
    }


def offering_rate(
    plan: str, option: str, years: int, rate: str, operation: str = "RunInstances"
) -> dict[str, Any]:
    """One `searchResults` entry (REFERENCE-ROUND2 §3b)."""
    return {
        "savingsPlanOffering": {
            "offeringId": f"{plan}-{option}-{years}".replace(" ", ""),
            "paymentOption": option,
            "planType": plan,
            "durationSeconds": years * 31_536_000,
            "currency": "USD",
            "planDescription": f"{years} year {option} {plan}",
        },
        "rate": rate,
        "unit": "Hrs",
        "productType": "EC2",
        "serviceCode": "AmazonEC2",
        "usageType": "BoxUsage:p5.48xlarge",
        "operation": operation,
        "properties": [
            {"name": "region", "value": "us-east-1"},
            {"name": "instanceType", "value": "p5.48xlarge"},
            {"name": "instanceFamily", "value": "p5"},
            {"name": "productDescription", "value": "Linux/UNIX"},
            {"name": "tenancy", "value": "shared"},
        ],
    }


def test_savings_plan_rates_pages_and_prepaid_share() -> None:
    session = StubSession()
    plans = session.stub("savingsplans")
    request = {
        "savingsPlanTypes": ["EC2Instance", "Compute"],
        "products": ["EC2"],
        "serviceCodes": ["AmazonEC2"],
        "filters": [
            {"name": "instanceType", "values": ["p5.48xlarge"]},
            {"name": "region", "values": ["us-east-1"]},
            {"name": "tenancy", "values": ["shared"]},
            {"name": "productDescription", "values": ["Linux/UNIX"]},
        ],
        "maxResults": 1000,
    }
    plans.add_response(
        "describe_savings_plans_offering_rates",
        {
            "searchResults": [
                offering_rate("EC2Instance", "No Upfront", 1, "37.1"),
                offering_rate("EC2Instance", "No Upfront", 1, "60.0", "RunInstances:0002"),
            ],
            "nextToken": "page-2",
        },
        request,
    )
    plans.add_response(
        "describe_savings_plans_offering_rates",
        {
            "searchResults": [
                offering_rate("EC2Instance", "All Upfront", 3, "26.5"),
                offering_rate("Compute", "Partial Upfront", 3, "30.0"),
            ]
        },
        {**request, "nextToken": "page-2"},
    )
    rates = C.savings_plan_rates(
        session.client("savingsplans", "us-east-1"), "p5.48xlarge", "us-east-1"
    )
    session.assert_done()
    got = {(r.kind, r.term_years, r.payment_option): r for r in rates}
    assert len(got) == 3  # the Windows rate is left out
    ec2_1y = got[("savings plan EC2Instance", 1, PaymentOption.NO_UPFRONT)]
    assert (ec2_1y.effective_usd_per_hour, ec2_1y.upfront_usd) == (37.1, 0.0)
    all_up = got[("savings plan EC2Instance", 3, PaymentOption.ALL_UPFRONT)]
    assert all_up.upfront_usd == pytest.approx(26.5 * 26_280)  # 696,420: every hour prepaid
    partial = got[("savings plan Compute", 3, PaymentOption.PARTIAL_UPFRONT)]
    assert partial.upfront_usd == pytest.approx(0.5 * 30.0 * 26_280)  # 394,200


def test_rates_become_committed_offers_with_the_on_demand_specs() -> None:
    spec = Offer(
        "aws",
        "us-east-1",
        None,
        "p5.48xlarge",
        "H100-80GB",
        8,
        80.0,
        192,
        2048.0,
        Interconnect.NVLINK,
        Market.ON_DEMAND,
        55.04,
        datetime(2026, 11, 1, tzinfo=UTC),
    )
    rate = C.Rate(
        "p5.48xlarge",
        "us-east-1",
        3,
        PaymentOption.ALL_UPFRONT,
        28.0,
        735_840.0,
        "reserved standard",
    )
    other = C.Rate("p5.48xlarge", "eu-north-1", 1, PaymentOption.NO_UPFRONT, 40.0, 0.0, "x")
    (offer,) = C.committed_offers([spec], [rate, other])
    assert offer.market is Market.COMMITTED
    assert (offer.usd_per_hour, offer.term_years, offer.upfront_usd) == (28.0, 3, 735_840.0)
    assert offer.recurring_usd_per_hour == pytest.approx(0.0)
    assert offer.gpu_model == "H100-80GB" and offer.source == "aws reserved standard"
