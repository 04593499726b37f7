"""AWS commitment rates against botocore's Stubber (requests and responses checked against the
service models): Reserved Instance terms from `pricing.get_products`, Savings Plans rates
from `savingsplans.describe_savings_plans_offering_rates`; effective prices by hand."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from optimizer.model import Interconnect, Market, Offer, PaymentOption
from providers.aws import AwsProvider
from providers.aws import commitments as C
from providers.aws import pricing as P
from tests.helpers.aws import (
    NOW,
    Clock,
    StubSession,
    offering_rate,
    price_item,
    reserved_term,
    savings_plans_request,
    stub_p5_market,
    stub_p5_price_list,
    stub_p5_region,
    with_reserved,
)


def test_reserved_terms_become_effective_hourly_rates() -> None:
    session = StubSession()
    pricing = session.stub("pricing")
    item = with_reserved(
        price_item("p5.48xlarge", "us-east-1", 55.04),
        reserved_term("4NA7Y494T4", "1yr", "No Upfront", 38.0, None),
        # 157,680 upfront over 8,760 h is $18/h, plus $18.50/h: $36.50 effective
        reserved_term("HU7G6KETJZ", "1yr", "Partial Upfront", 18.5, 157_680),
        # 735,840 upfront over 26,280 h: $28/h, no hourly fee
        reserved_term("MZU6U2429S", "3yr", "All Upfront", 0.0, 735_840),
        reserved_term("7NE97W5U4E", "3yr", "No Upfront", 33.0, None, offering="convertible"),
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


def test_savings_plan_rates_pages_and_prepaid_share() -> None:
    session = StubSession()
    plans = session.stub("savingsplans")
    request = savings_plans_request("p5.48xlarge", "us-east-1")
    plans.add_response(
        "describe_savings_plans_offering_rates",
        {
            "searchResults": [
                offering_rate("EC2Instance", "No Upfront", 1, "37.1"),
                offering_rate(
                    "EC2Instance", "No Upfront", 1, "60.0", operation="RunInstances:0002"
                ),
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


# --- the provider's poll: committed offers beside spot and on-demand ----------------------

P5_RESERVED = (
    reserved_term("4NA7Y494T4", "1yr", "No Upfront", 38.0, None),
    # 157,680 upfront over 8,760 h is $18/h, plus $18.50/h: $36.50 effective
    reserved_term("HU7G6KETJZ", "1yr", "Partial Upfront", 18.5, 157_680),
    # 735,840 upfront over 26,280 h: $28/h
    reserved_term("MZU6U2429S", "3yr", "All Upfront", 0.0, 735_840),
    reserved_term("7NE97W5U4E", "3yr", "No Upfront", 33.0, None, offering="convertible"),
)
P5_PLANS = [
    offering_rate("EC2Instance", "No Upfront", 1, "37.1"),
    offering_rate("Compute", "All Upfront", 3, "26.5"),
    offering_rate("EC2Instance", "No Upfront", 1, "40.0", region="eu-west-1"),  # not polled
]
# (source, term, payment) → (effective $/h, upfront $), worked by hand above and here:
# the all-upfront Compute plan prepays 26.5 x 26,280 h = $696,420.
P5_COMMITTED = {
    ("aws reserved standard", 1, PaymentOption.NO_UPFRONT): (38.0, 0.0),
    ("aws reserved standard", 1, PaymentOption.PARTIAL_UPFRONT): (36.5, 157_680.0),
    ("aws reserved standard", 3, PaymentOption.ALL_UPFRONT): (28.0, 735_840.0),
    ("aws savings plan EC2Instance", 1, PaymentOption.NO_UPFRONT): (37.1, 0.0),
    ("aws savings plan Compute", 3, PaymentOption.ALL_UPFRONT): (26.5, 696_420.0),
}


def stub_plans(session: StubSession, results: list[dict[str, Any]] = P5_PLANS) -> None:
    session.stub("savingsplans", "us-east-1").add_response(
        "describe_savings_plans_offering_rates",
        {"searchResults": results},
        savings_plans_request("p5.48xlarge"),
    )


def committed(offers: list[Offer]) -> dict[tuple[str, int, PaymentOption], tuple[float, float]]:
    out = {}
    for o in offers:
        if o.market is Market.COMMITTED:
            assert o.term_years is not None and o.payment_option is not None
            out[(o.source, o.term_years, o.payment_option)] = (
                pytest.approx(o.usd_per_hour),
                pytest.approx(o.upfront_usd),
            )
    return out


@pytest.mark.usefixtures("aws_env", "offline")
def test_a_poll_with_commitments_offers_each_rate_with_the_on_demand_specs() -> None:
    session = StubSession()
    stub_p5_region(session, NOW)
    stub_p5_price_list(session, *P5_RESERVED)  # one chain: list prices and Reserved terms
    stub_plans(session)
    aws = AwsProvider(session=session, clock=Clock(), max_workers=1, commitments=True)
    offers = aws.fetch_offers(["us-east-1"])
    session.assert_done()
    assert aws.problems == []
    assert committed(offers) == P5_COMMITTED
    rows = [o for o in offers if o.market is Market.COMMITTED]
    assert {(o.region, o.zone, o.instance_type, o.gpu_model, o.gpu_count) for o in rows} == {
        ("us-east-1", None, "p5.48xlarge", "H100-80GB", 8)
    }
    assert {o.market for o in offers} == {Market.SPOT, Market.ON_DEMAND, Market.COMMITTED}


@pytest.mark.usefixtures("aws_env", "offline")
def test_without_commitments_no_rate_is_asked_for() -> None:
    session = StubSession()
    stub_p5_region(session, NOW)
    stub_p5_price_list(session, *P5_RESERVED)
    offers = AwsProvider(session=session, clock=Clock(), max_workers=1).fetch_offers(["us-east-1"])
    session.assert_done()
    assert {o.market for o in offers} == {Market.SPOT, Market.ON_DEMAND}
    assert ("savingsplans", "us-east-1") not in session.made


@pytest.mark.usefixtures("aws_env", "offline")
def test_commitment_rates_are_cached_a_day_and_reserved_terms_ride_on_list_prices() -> None:
    clock, session = Clock(), StubSession()
    stub_p5_region(session, clock.now)
    stub_p5_price_list(session, *P5_RESERVED)
    stub_plans(session)
    aws = AwsProvider(session=session, clock=clock, max_workers=1, commitments=True)
    aws.fetch_offers(["us-east-1"])
    session.assert_done()

    # 13 h on: the list prices (12 h) are read again, and their Reserved terms with them;
    # the Savings Plans rates (24 h) are not asked: the Stubber would refuse the call.
    clock.advance(hours=13)
    stub_p5_market(session, clock.now)
    stub_p5_price_list(session, reserved_term("4NA7Y494T4", "1yr", "No Upfront", 35.0, None))
    later = aws.fetch_offers(["us-east-1"])
    session.assert_done()
    assert aws.problems == []
    assert committed(later) == {
        ("aws reserved standard", 1, PaymentOption.NO_UPFRONT): (35.0, 0.0),
        ("aws savings plan EC2Instance", 1, PaymentOption.NO_UPFRONT): (37.1, 0.0),
        ("aws savings plan Compute", 3, PaymentOption.ALL_UPFRONT): (26.5, 696_420.0),
    }

    # A day after the first poll: the Savings Plans rates are asked again.
    clock.advance(hours=12)
    stub_p5_region(session, clock.now)
    stub_plans(session, P5_PLANS[:1])
    assert len([o for o in aws.fetch_offers(["us-east-1"]) if o.market is Market.COMMITTED]) == 2
    session.assert_done()


@pytest.mark.usefixtures("aws_env", "offline")
def test_a_refused_savings_plans_call_is_a_problem_and_reserved_rates_still_flow() -> None:
    session = StubSession()
    stub_p5_region(session, NOW)
    stub_p5_price_list(session, *P5_RESERVED)
    session.stub("savingsplans", "us-east-1").add_client_error(
        "describe_savings_plans_offering_rates",
        "AccessDeniedException",
        "not authorized to perform: savingsplans:DescribeSavingsPlansOfferingRates",
        http_status_code=400,
    )
    aws = AwsProvider(session=session, clock=Clock(), max_workers=1, commitments=True)
    offers = aws.fetch_offers(["us-east-1"])
    session.assert_done()
    assert {k[0] for k in committed(offers)} == {"aws reserved standard"}
    (problem,) = aws.problems
    assert problem.startswith("savings plans rates unavailable: AccessDeniedException")
    assert "1 of 1 types" in problem


@pytest.mark.usefixtures("aws_env", "offline")
def test_tco_prices_each_term_at_the_cheapest_live_rate() -> None:
    from optimizer.costs.tco import Usage
    from optimizer.costs.tco_assumptions import Assumptions
    from optimizer.costs.tco_plan import plan

    session = StubSession()
    stub_p5_region(session, NOW)
    stub_p5_price_list(session, *P5_RESERVED)
    stub_plans(session)
    aws = AwsProvider(session=session, clock=Clock(), max_workers=1, commitments=True)
    offers = aws.fetch_offers(["us-east-1"])
    result = plan(Usage("H100-80GB", 8, 500.0, 3), offers, Assumptions(), tdp_w=700.0)
    totals = {o.name: o.total(500.0) for o in result.options if o.name.startswith("committed")}
    assert totals == {
        # the EC2 Instance plan's $37.10 beats the reserved $38.00: 3 one-year terms
        "committed 1y no upfront": pytest.approx(37.1 * 8760 * 3),  # 975,004
        "committed 1y partial upfront": pytest.approx(36.5 * 8760 * 3),  # 959,220
        # the Compute plan's $26.50 beats the reserved $28.00 over one 26,280 h term
        "committed 3y all upfront": pytest.approx(26.5 * 26_280),  # 696,420
    }
    assert not any("estimated" in n for o in result.options for n in o.notes)
