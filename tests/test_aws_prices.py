"""Price logic against botocore's Stubber, which checks requests and responses against the
real service models: spot history across zones and pages, Price List pages, placement
scores, partial failures and the daily spec cache."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from optimizer.model import Interconnect, Market
from providers.aws import AwsProvider
from providers.aws import offers as O
from providers.aws import pricing as P
from providers.base import AuthError
from tests.helpers.aws import NOW, Clock, StubSession, gpu_type_info, price_item

pytestmark = pytest.mark.usefixtures("aws_env", "offline")

ZONES = {"us-east-1a": "use1-az6", "us-east-1b": "use1-az1", "us-east-1c": "use1-az2"}
TYPES = [
    gpu_type_info("g6.xlarge", "L4", 1, 22888, vcpus=4, ram_mib=16384),
    gpu_type_info("g6.2xlarge", "L4", 1, 22888),
    gpu_type_info("g6f.large", "L4", 0, 2861),  # a fractional slice: not a whole-GPU offer
    gpu_type_info(
        "p5.48xlarge",
        "H100",
        8,
        81920,
        vcpus=192,
        ram_mib=2097152,
        classes=("capacity-block", "on-demand", "spot"),
    ),
]
WHOLE = ["g6.2xlarge", "g6.xlarge", "p5.48xlarge"]
OFFERED = {
    "g6.xlarge": ["us-east-1a", "us-east-1b", "us-east-1c"],
    "g6.2xlarge": ["us-east-1a", "us-east-1b"],
    "p5.48xlarge": ["us-east-1b"],
}
SPOT_PRODUCTS = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]
LIST_PRICES = {"g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "p5.48xlarge": 55.04}


def _spot_row(kind: str, zone: str, usd: float, age_h: float, product: str = "Linux/UNIX") -> dict:
    return {
        "AvailabilityZone": zone,
        "InstanceType": kind,
        "ProductDescription": product,
        "SpotPrice": f"{usd:.6f}",
        "Timestamp": NOW - timedelta(hours=age_h),
    }


# Two pages; each pool's newest row is not always first, and page 2 holds older rows.
SPOT_PAGES = [
    [
        _spot_row("g6.xlarge", "us-east-1a", 0.3101, 30),
        _spot_row("g6.xlarge", "us-east-1a", 0.3402, 2),
        _spot_row("g6.xlarge", "us-east-1b", 0.2950, 5, "Linux/UNIX (Amazon VPC)"),
        _spot_row("g6.2xlarge", "us-east-1a", 0.4100, 1),
        _spot_row("p5.48xlarge", "us-east-1b", 31.464, 7),
    ],
    [
        _spot_row("g6.xlarge", "us-east-1a", 0.9999, 80),  # older: ignored
        _spot_row("g6.xlarge", "us-east-1c", 0.2877, 3),
        _spot_row("g6.2xlarge", "us-east-1b", 0.4500, 12),
        _spot_row("p5.48xlarge", "us-east-1b", 40.000, 50),  # older: ignored
    ],
]
LATEST = {
    ("g6.xlarge", "us-east-1a"): 0.3402,
    ("g6.xlarge", "us-east-1b"): 0.2950,
    ("g6.xlarge", "us-east-1c"): 0.2877,
    ("g6.2xlarge", "us-east-1a"): 0.41,
    ("g6.2xlarge", "us-east-1b"): 0.45,
    ("p5.48xlarge", "us-east-1b"): 31.464,
}


def _type_filters() -> dict[str, Any]:
    return {"Filters": [{"Name": "instance-type", "Values": ["g*", "p*"]}]}


def stub_inventory(session: StubSession, region: str = "us-east-1") -> None:
    ec2 = session.stub("ec2", region)
    ec2.add_response("describe_instance_types", {"InstanceTypes": TYPES}, _type_filters())
    ec2.add_response(
        "describe_availability_zones",
        {
            "AvailabilityZones": [
                {"ZoneName": name, "ZoneId": zid, "RegionName": region, "State": "available"}
                for name, zid in ZONES.items()
            ]
        },
        {},
    )


def stub_market(
    session: StubSession, region: str = "us-east-1", pages: list | None = None, now: Any = NOW
) -> None:
    ec2 = session.stub("ec2", region)
    ec2.add_response(
        "describe_instance_type_offerings",
        {
            "InstanceTypeOfferings": [
                {"InstanceType": kind, "LocationType": "availability-zone", "Location": zone}
                for kind, zones in OFFERED.items()
                for zone in zones
            ]
        },
        {
            "LocationType": "availability-zone",
            "Filters": [{"Name": "instance-type", "Values": WHOLE}],
        },
    )
    pages = SPOT_PAGES if pages is None else pages
    for number, rows in enumerate(pages):
        params: dict[str, Any] = {
            "InstanceTypes": WHOLE,
            "ProductDescriptions": SPOT_PRODUCTS,
            "StartTime": now,
            "MaxResults": O.SPOT_PAGE_SIZE,
        }
        reply: dict[str, Any] = {"SpotPriceHistory": rows}
        if number:
            params["NextToken"] = f"page-{number}"
        if number + 1 < len(pages):
            reply["NextToken"] = f"page-{number + 1}"
        ec2.add_response("describe_spot_price_history", reply, params)


def stub_list_prices(session: StubSession, prices: dict[str, float] = LIST_PRICES) -> None:
    pricing = session.stub("pricing", "us-east-1")
    for kind in sorted(prices):
        pricing.add_response(
            "get_products",
            {
                "FormatVersion": "aws_v1",
                "PriceList": [
                    price_item(kind, "us-east-1", prices[kind]),
                    price_item(kind, "eu-west-1", prices[kind] * 1.1, location="EU (Ireland)"),
                ],
            },
            {
                "ServiceCode": "AmazonEC2",
                "Filters": P.product_filters(kind),
                "FormatVersion": "aws_v1",
                "MaxResults": P.PAGE_SIZE,
            },
        )


def provider(session: StubSession, clock: Clock | None = None, **kwargs: Any) -> AwsProvider:
    return AwsProvider(session=session, clock=clock or Clock(), max_workers=1, **kwargs)


# --- spot history ------------------------------------------------------------------------------


def test_latest_spot_price_per_type_and_zone_wins_across_pages() -> None:
    session = StubSession()
    stub_market(session)
    ec2 = session.client("ec2", "us-east-1")
    ec2.describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": WHOLE}]
    )
    rows = O.spot_history(ec2, WHOLE, NOW)
    assert len(rows) == 9
    assert O.latest_spot_prices(rows) == LATEST
    session.assert_done()


def test_other_products_and_unusable_prices_are_ignored() -> None:
    rows = [
        _spot_row("g6.xlarge", "us-east-1a", 0.30, 1),
        _spot_row("g6.xlarge", "us-east-1a", 0.10, 0, "Windows"),
        {**_spot_row("g6.xlarge", "us-east-1b", 0.0, 0)},
        {**_spot_row("g6.xlarge", "us-east-1c", 0.0, 0), "SpotPrice": "n/a"},
        # Same instant, both Linux descriptions: the lower price stands.
        _spot_row("g6.2xlarge", "us-east-1a", 0.50, 1),
        _spot_row("g6.2xlarge", "us-east-1a", 0.45, 1, "Linux/UNIX (Amazon VPC)"),
    ]
    assert O.latest_spot_prices(rows) == {
        ("g6.xlarge", "us-east-1a"): 0.30,
        ("g6.2xlarge", "us-east-1a"): 0.45,
    }


# --- Price List --------------------------------------------------------------------------------


def test_get_products_pages_parse_into_a_price_per_region() -> None:
    session = StubSession()
    pricing = session.stub("pricing")
    base = {
        "ServiceCode": "AmazonEC2",
        "Filters": P.product_filters("p5.48xlarge"),
        "FormatVersion": "aws_v1",
        "MaxResults": 100,
    }
    pricing.add_response(
        "get_products",
        {
            "FormatVersion": "aws_v1",
            "PriceList": [
                price_item("p5.48xlarge", "us-east-1", 55.04),
                # Capacity blocks are listed at $0 per hour: never an on-demand price.
                price_item("p5.48xlarge", "us-east-1", 0.0, market="CapacityBlock"),
                price_item("p5.48xlarge", "us-west-2", 0.0),
            ],
            "NextToken": "next",
        },
        base,
    )
    pricing.add_response(
        "get_products",
        {
            "FormatVersion": "aws_v1",
            "PriceList": [
                price_item("p5.48xlarge", "eu-north-1", 58.12, location="EU (Stockholm)"),
                price_item("p5.48xlarge", "eu-north-1", 1.0, capacity="UnusedCapacityReservation"),
            ],
        },
        {**base, "NextToken": "next"},
    )
    prices = P.on_demand_prices(session.client("pricing", "us-east-1"), "p5.48xlarge")
    assert prices == {"us-east-1": 55.04, "eu-north-1": 58.12}
    session.assert_done()


def test_bare_metal_types_are_priced_under_dedicated_tenancy() -> None:
    fields = {f["Field"]: f["Value"] for f in P.product_filters("g4dn.metal", "us-east-1")}
    assert fields["tenancy"] == "Dedicated" and fields["regionCode"] == "us-east-1"
    fields = {f["Field"]: f["Value"] for f in P.product_filters("g4dn.xlarge")}
    assert fields == {
        "instanceType": "g4dn.xlarge",
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
    }


# --- whole polls -------------------------------------------------------------------------------


def test_a_poll_prices_spot_per_zone_id_and_on_demand_per_offered_zone() -> None:
    session = StubSession()
    stub_inventory(session)
    stub_market(session)
    stub_list_prices(session)
    aws = provider(session)
    offers = aws.fetch_offers(["us-east-1"])
    session.assert_done()
    assert aws.problems == []

    spot = {(o.instance_type, o.zone): o.usd_per_hour for o in offers if o.market is Market.SPOT}
    assert spot == {(kind, ZONES[name]): usd for (kind, name), usd in LATEST.items()}
    on_demand = {(o.instance_type, o.zone) for o in offers if o.market is Market.ON_DEMAND}
    assert on_demand == {(k, ZONES[z]) for k, zones in OFFERED.items() for z in zones}
    assert all(
        o.usd_per_hour == LIST_PRICES[o.instance_type]
        for o in offers
        if o.market is Market.ON_DEMAND
    )
    assert not any(o.instance_type.startswith("g6f") for o in offers)
    assert {o.source for o in offers} == {"aws-api"}
    assert {o.observed_at for o in offers} == {NOW}
    h100 = next(o for o in offers if o.instance_type == "p5.48xlarge")
    assert (h100.gpu_model, h100.gpu_count, h100.interconnect) == (
        "H100-80GB",
        8,
        Interconnect.NVLINK,
    )
    assert (h100.vcpus, h100.ram_gib, h100.gpu_memory_gib) == (192, 2048, 80)


def test_placement_scores_are_attached_to_spot_offers_per_zone() -> None:
    session = StubSession()
    stub_inventory(session)
    stub_market(session)
    stub_list_prices(session)
    ec2 = session.stub("ec2")
    for group, scores in (
        (["g6.2xlarge", "g6.xlarge"], {"use1-az6": 9, "use1-az1": 3}),
        (["p5.48xlarge"], {"use1-az1": 1}),
    ):
        ec2.add_response(
            "get_spot_placement_scores",
            {
                "SpotPlacementScores": [
                    {"Region": "us-east-1", "AvailabilityZoneId": z, "Score": s}
                    for z, s in scores.items()
                ]
            },
            {
                "InstanceTypes": group,
                "TargetCapacity": 1,
                "TargetCapacityUnitType": "units",
                "SingleAvailabilityZone": True,
                "RegionNames": ["us-east-1"],
            },
        )
    aws = provider(session, placement_scores=True)
    offers = aws.fetch_offers(["us-east-1"])
    session.assert_done()
    scored = {
        (o.instance_type, o.zone): o.placement_score for o in offers if o.market is Market.SPOT
    }
    assert scored[("g6.xlarge", "use1-az6")] == 9
    assert scored[("g6.2xlarge", "use1-az1")] == 3
    assert scored[("g6.xlarge", "use1-az2")] is None  # not in the top scores
    assert scored[("p5.48xlarge", "use1-az1")] == 1
    assert all(o.placement_score is None for o in offers if o.market is Market.ON_DEMAND)


def test_a_failing_placement_score_call_never_blocks_prices() -> None:
    session = StubSession()
    stub_inventory(session)
    stub_market(session)
    stub_list_prices(session)
    ec2 = session.stub("ec2")
    ec2.add_client_error("get_spot_placement_scores", "UnauthorizedOperation", http_status_code=403)
    ec2.add_client_error("get_spot_placement_scores", "UnauthorizedOperation", http_status_code=403)
    aws = provider(session, placement_scores=True)
    offers = aws.fetch_offers(["us-east-1"])
    assert len(offers) == 12
    assert all(o.placement_score is None for o in offers)
    assert len(aws.problems) == 1
    assert aws.problems[0].startswith("placement scores unavailable: UnauthorizedOperation")


def test_pricing_unreachable_keeps_spot_flowing_and_is_reported_once() -> None:
    session = StubSession()
    stub_inventory(session)
    stub_market(session)
    # One failure only: the remaining types are not asked once pricing has failed this poll.
    session.stub("pricing").add_client_error(
        "get_products", "AccessDeniedException", "not allowed", http_status_code=400
    )
    aws = provider(session)
    offers = aws.fetch_offers(["us-east-1"])
    session.assert_done()
    assert {o.market for o in offers} == {Market.SPOT} and len(offers) == 6
    assert len(aws.problems) == 1
    assert aws.problems[0].startswith("pricing unreachable: AccessDeniedException")
    assert "3 of 3 types" in aws.problems[0]


def test_list_prices_and_specs_are_reused_until_they_age(store: Any) -> None:
    clock = Clock()
    session = StubSession()
    stub_inventory(session)
    stub_market(session)
    stub_list_prices(session)
    aws = AwsProvider(session=session, clock=clock, cache=store.prices, max_workers=1)
    first = aws.fetch_offers(["us-east-1"])
    session.assert_done()

    # An hour on: only offerings and spot history are asked again.
    clock.advance(hours=1)
    stub_market(session, pages=[[_spot_row("g6.xlarge", "us-east-1a", 0.25, 0)]], now=clock.now)
    second = aws.fetch_offers(["us-east-1"])
    session.assert_done()
    assert len([o for o in second if o.market is Market.ON_DEMAND]) == 6
    assert len(first) == 12 and len(second) == 7

    # A day on: the specs and zone map are refetched; list prices (12 h) too.
    clock.advance(hours=24)
    stub_inventory(session)
    stub_market(session, now=clock.now)
    stub_list_prices(session)
    assert len(aws.fetch_offers(["us-east-1"])) == 12
    session.assert_done()


def test_a_failed_spec_refresh_falls_back_to_the_cached_copy() -> None:
    clock = Clock()
    session = StubSession()
    stub_inventory(session)
    stub_market(session)
    stub_list_prices(session)
    aws = provider(session, clock)
    aws.fetch_offers(["us-east-1"])

    clock.advance(hours=25)
    ec2 = session.stub("ec2")
    ec2.add_client_error("describe_instance_types", "RequestLimitExceeded", http_status_code=503)
    ec2.add_client_error(
        "describe_availability_zones", "RequestLimitExceeded", http_status_code=503
    )
    stub_market(session, now=clock.now)
    stub_list_prices(session)
    offers = aws.fetch_offers(["us-east-1"])
    session.assert_done()
    assert len(offers) == 12
    assert [p.split(" (")[0] for p in aws.problems] == [
        "us-east-1: instance types not refreshed",
        "us-east-1: zone IDs not refreshed",
    ]


def test_one_failing_region_is_a_problem_and_all_failing_is_an_error() -> None:
    session = StubSession()
    stub_inventory(session)
    stub_market(session)
    stub_list_prices(session)
    # An opt-in region the account has not enabled answers AuthFailure (REFERENCE.md §1.1).
    session.stub("ec2", "ap-east-1").add_client_error(
        "describe_instance_types", "AuthFailure", "not enabled", http_status_code=401
    )
    aws = provider(session)
    offers = aws.fetch_offers(["us-east-1", "ap-east-1"])
    assert {o.region for o in offers} == {"us-east-1"}
    assert aws.problems == ["ap-east-1: AuthFailure (DescribeInstanceTypes): not enabled"]

    session.stub("ec2", "ap-east-1").add_client_error(
        "describe_instance_types", "AuthFailure", "not enabled", http_status_code=401
    )
    with pytest.raises(AuthError, match="AuthFailure"):
        aws.fetch_offers(["ap-east-1"])


def test_without_a_region_list_the_enabled_regions_are_polled() -> None:
    session = StubSession()
    session.stub("ec2").add_response(
        "describe_regions", {"Regions": [{"RegionName": "us-east-1"}]}, {}
    )
    stub_inventory(session)
    stub_market(session)
    stub_list_prices(session)
    offers = provider(session).fetch_offers()
    session.assert_done()
    assert {o.region for o in offers} == {"us-east-1"}
