"""Shared fixtures for the AWS adapter tests: fake credentials, no internet, Stubber sessions,
realistic Price List rows and a moto server. Other test_aws_* modules import from here.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials only: no profile, no config file, no instance metadata lookups."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection beyond loopback fails the test: moto and Stubber only."""
    real_connect = socket.socket.connect

    def guarded(sock: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in LOOPBACK and not host.startswith("/"):
            raise AssertionError(f"a test tried to reach {address!r}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


class Clock:
    """An injected clock the test moves by hand."""

    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


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


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    """A moto server on a free loopback port, for the module; yields its URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def test_no_test_can_reach_beyond_loopback() -> None:
    with pytest.raises(AssertionError, match="tried to reach"):
        socket.create_connection(("192.0.2.1", 443), timeout=0.01)


def test_fake_credentials_are_the_only_ones() -> None:
    import boto3

    credentials = boto3.session.Session().get_credentials()
    assert credentials is not None and credentials.access_key == "testing"
