"""For the AWS adapter tests: a hand-moved clock, Stubber sessions, realistic Price List rows
and DescribeInstanceTypes entries, and the EventBridge events of an interruption queue. The
fixtures that keep these tests offline with fake credentials (aws_env, offline) and the moto
server are in conftest.py.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from optimizer.clock import ManualClock

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
QUEUE_REGION = "eu-west-1"  # where the interruption queue and its events are


class Clock(ManualClock):
    """A ManualClock from NOW; `now` reads it."""

    def __init__(self, now: datetime = NOW) -> None:
        super().__init__(now)

    @property
    def now(self) -> datetime:
        return self()


class StubSession:
    """A boto3 Session stand-in: prepared (Stubber) clients where set up, real ones otherwise.

    Real clients come from a real Session, so under `moto.mock_aws` they talk to moto; with
    `strict=True` any client not prepared is refused, so nothing can leave the process.
    """

    def __init__(self, region: str = "us-east-1", *, strict: bool = True) -> None:
        import boto3

        self.base = boto3.session.Session(region_name=region)
        self.region_name = region
        self.strict = strict
        self.stubs: dict[tuple[str, str], Any] = {}
        self._clients: dict[tuple[str, str], Any] = {}
        self.made: list[tuple[str, str]] = []

    def stub(self, service: str, region: str = "us-east-1") -> Any:
        from botocore.stub import Stubber

        key = (service, region)
        if key not in self.stubs:
            client = self.base.client(service, region_name=region)
            stubber = Stubber(client)
            stubber.activate()
            self._clients[key] = client
            self.stubs[key] = stubber
        return self.stubs[key]

    def client(self, service: str, region_name: str | None = None, **kwargs: Any) -> Any:
        key = (service, region_name or self.region_name)
        self.made.append(key)
        if key in self._clients:
            return self._clients[key]
        if self.strict:
            raise AssertionError(f"unexpected client {key}")
        return self.base.client(service, region_name=key[1], **kwargs)

    def get_credentials(self) -> Any:
        return self.base.get_credentials()

    def assert_done(self) -> None:
        for stubber in self.stubs.values():
            stubber.assert_no_pending_responses()


def price_item(
    instance_type: str,
    region: str,
    usd: float,
    *,
    market: str = "OnDemand",
    capacity: str = "Used",
    location: str = "US East (N. Virginia)",
) -> str:
    """One Price List `get_products` element as AWS sends it: a JSON *string*.

    Shape: product.attributes.* and terms.OnDemand.<offer>.priceDimensions.<rate>.pricePerUnit.
    """
    sku = hashlib.sha256(f"{instance_type}/{region}/{market}".encode()).hexdigest()[:16].upper()
    offer = f"{sku}.JRTCKXETXF"
    rate = f"{offer}.6YS6EN2CT7"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "servicecode": "AmazonEC2",
                    "instanceType": instance_type,
                    "instanceFamily": "GPU instance",
                    "regionCode": region,
                    "location": location,
                    "locationType": "AWS Region",
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "licenseModel": "No License required",
                    "capacitystatus": capacity,
                    "marketoption": market,
                    "operation": "RunInstances",
                    "usagetype": f"BoxUsage:{instance_type}",
                },
                "sku": sku,
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    offer: {
                        "priceDimensions": {
                            rate: {
                                "unit": "Hrs",
                                "endRange": "Inf",
                                "description": f"${usd} per On Demand Linux {instance_type} "
                                "Instance Hour",
                                "appliesTo": [],
                                "rateCode": rate,
                                "beginRange": "0",
                                "pricePerUnit": {"USD": f"{usd:.10f}"},
                            }
                        },
                        "sku": sku,
                        "effectiveDate": "2026-11-01T00:00:00Z",
                        "offerTermCode": "JRTCKXETXF",
                        "termAttributes": {},
                    }
                }
            },
            "version": "20261101000000",
            "publicationDate": "2026-11-01T00:00:00Z",
        }
    )


def gpu_type_info(
    name: str,
    gpu: str,
    count: int,
    memory_mib: int,
    *,
    vcpus: int = 8,
    ram_mib: int = 32768,
    classes: tuple[str, ...] = ("on-demand", "spot"),
    arch: str = "x86_64",
) -> dict[str, Any]:
    """A DescribeInstanceTypes entry with GpuInfo, as the API shapes it."""
    return {
        "InstanceType": name,
        "SupportedUsageClasses": list(classes),
        "ProcessorInfo": {"SupportedArchitectures": [arch]},
        "VCpuInfo": {"DefaultVCpus": vcpus},
        "MemoryInfo": {"SizeInMiB": ram_mib},
        "NetworkInfo": {"NetworkPerformance": "Up to 25 Gigabit", "EfaSupported": False},
        "GpuInfo": {
            "Gpus": [
                {
                    "Name": gpu,
                    "Manufacturer": "NVIDIA",
                    "Count": count,
                    "MemoryInfo": {"SizeInMiB": memory_mib},
                }
            ],
            "TotalGpuMemoryInMiB": count * memory_mib,
        },
    }


# -- the interruption queue's events ----------------------------------------------------


def spot_warning(instance_id: str, action: str = "terminate") -> dict[str, Any]:
    """EventBridge's EC2 Spot Instance Interruption Warning. The ARN's region slot holds an
    AZ and the account is empty, as AWS sends it (NTH#762)."""
    return {
        "version": "0",
        "id": "1e5527d7-bb36-4607-3370-4164db56a40e",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-11-30T12:00:05Z",
        "region": QUEUE_REGION,
        "resources": [f"arn:aws:ec2:{QUEUE_REGION}b:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    }


def rebalance(instance_id: str) -> dict[str, Any]:
    return {
        "version": "0",
        "id": "2fe2c7a8-84d6-4f6a-9bdc-5ac5f1e7c1f0",
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-11-30T11:58:00Z",
        "region": QUEUE_REGION,
        "resources": [f"arn:aws:ec2:{QUEUE_REGION}b:instance/{instance_id}"],
        "detail": {"instance-id": instance_id},
    }


def state_change(instance_id: str, state: str = "shutting-down") -> dict[str, Any]:
    return {
        "version": "0",
        "id": "7bf73129-1428-4cd3-a780-95db273d1602",
        "detail-type": "EC2 Instance State-change Notification",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-11-30T12:02:05Z",
        "region": QUEUE_REGION,
        "resources": [f"arn:aws:ec2:{QUEUE_REGION}:123456789012:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "state": state},
    }


# -- one p5.48xlarge in one zone, with its commitment rates -------------------------------

P5_ZONE, P5_ZONE_ID = "us-east-1b", "use1-az1"
P5_ON_DEMAND = 55.04


def reserved_term(
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
    """A Price List element with these Reserved terms beside its OnDemand one."""
    data = json.loads(item)
    data["terms"]["Reserved"] = {f"SKU.{t['offerTermCode']}": t for t in terms}
    return json.dumps(data)


def offering_rate(
    plan: str,
    option: str,
    years: int,
    rate: str,
    *,
    operation: str = "RunInstances",
    region: str = "us-east-1",
    instance_type: str = "p5.48xlarge",
) -> dict[str, Any]:
    """One DescribeSavingsPlansOfferingRates `searchResults` entry (REFERENCE-ROUND2 §3b)."""
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
        "usageType": f"BoxUsage:{instance_type}",
        "operation": operation,
        "properties": [
            {"name": "region", "value": region},
            {"name": "instanceType", "value": instance_type},
            {"name": "instanceFamily", "value": instance_type.split(".")[0]},
            {"name": "productDescription", "value": "Linux/UNIX"},
            {"name": "tenancy", "value": "shared"},
        ],
    }


def savings_plans_request(instance_type: str, region: str | None = None) -> dict[str, Any]:
    """The DescribeSavingsPlansOfferingRates request for one type (every region without one)."""
    filters: list[dict[str, Any]] = [{"name": "instanceType", "values": [instance_type]}]
    if region is not None:
        filters.append({"name": "region", "values": [region]})
    filters += [
        {"name": "tenancy", "values": ["shared"]},
        {"name": "productDescription", "values": ["Linux/UNIX"]},
    ]
    return {
        "savingsPlanTypes": ["EC2Instance", "Compute"],
        "products": ["EC2"],
        "serviceCodes": ["AmazonEC2"],
        "filters": filters,
        "maxResults": 1000,
    }


def stub_p5_region(session: StubSession, now: datetime, spot_usd: float = 31.464) -> None:
    """DescribeInstanceTypes, DescribeAvailabilityZones, the offerings and spot history of
    us-east-1 selling one p5.48xlarge (8 H100) in one zone."""
    ec2 = session.stub("ec2", "us-east-1")
    info = gpu_type_info("p5.48xlarge", "H100", 8, 81920, vcpus=192, ram_mib=2097152)
    ec2.add_response(
        "describe_instance_types",
        {"InstanceTypes": [info]},
        {"Filters": [{"Name": "instance-type", "Values": ["g*", "p*"]}]},
    )
    ec2.add_response(
        "describe_availability_zones",
        {
            "AvailabilityZones": [
                {
                    "ZoneName": P5_ZONE,
                    "ZoneId": P5_ZONE_ID,
                    "RegionName": "us-east-1",
                    "State": "available",
                }
            ]
        },
        {},
    )
    stub_p5_market(session, now, spot_usd)


def stub_p5_market(session: StubSession, now: datetime, spot_usd: float = 31.464) -> None:
    """The per-poll calls of that region: offerings and the spot price in effect at `now`."""
    ec2 = session.stub("ec2", "us-east-1")
    ec2.add_response(
        "describe_instance_type_offerings",
        {
            "InstanceTypeOfferings": [
                {
                    "InstanceType": "p5.48xlarge",
                    "LocationType": "availability-zone",
                    "Location": P5_ZONE,
                }
            ]
        },
        {
            "LocationType": "availability-zone",
            "Filters": [{"Name": "instance-type", "Values": ["p5.48xlarge"]}],
        },
    )
    ec2.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                {
                    "AvailabilityZone": P5_ZONE,
                    "InstanceType": "p5.48xlarge",
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": f"{spot_usd:.6f}",
                    "Timestamp": now,
                }
            ]
        },
        {
            "InstanceTypes": ["p5.48xlarge"],
            "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            "StartTime": now,
            "MaxResults": 1000,
        },
    )


def stub_p5_price_list(session: StubSession, *reserved: dict[str, Any]) -> None:
    """One GetProducts chain for p5.48xlarge, every region: us-east-1 at $55.04/h with the
    Reserved terms given, and eu-west-1 (not polled) with the same."""
    from providers.aws import pricing as P

    items = [
        with_reserved(price_item("p5.48xlarge", "us-east-1", P5_ON_DEMAND), *reserved),
        with_reserved(
            price_item("p5.48xlarge", "eu-west-1", 60.0, location="EU (Ireland)"), *reserved
        ),
    ]
    session.stub("pricing", "us-east-1").add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": items},
        {
            "ServiceCode": "AmazonEC2",
            "Filters": P.product_filters("p5.48xlarge"),
            "FormatVersion": "aws_v1",
            "MaxResults": P.PAGE_SIZE,
        },
    )
