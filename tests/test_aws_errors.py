"""AWS error codes become typed errors at the boundary; missing credentials disable AWS."""

from __future__ import annotations

from typing import Any

import pytest

from providers.aws import AwsProvider, aws_disabled_reason, translate
from providers.base import (
    AuthError,
    CapacityError,
    PriceTooLowError,
    ProviderDisabled,
    ProviderError,
    QuotaError,
    ThrottledError,
)
from tests.helpers.aws import StubSession

pytestmark = pytest.mark.usefixtures("aws_env", "offline")

ZONE = "use1-az4"

# Every code issue 4 names, with the class it must become.
CODES: list[tuple[str, type[ProviderError], int]] = [
    ("InsufficientInstanceCapacity", CapacityError, 500),
    ("Unsupported", CapacityError, 400),
    ("VcpuLimitExceeded", QuotaError, 400),
    ("MaxSpotInstanceCountExceeded", QuotaError, 400),
    ("SpotMaxPriceTooLow", PriceTooLowError, 400),
    ("RequestLimitExceeded", ThrottledError, 503),
    ("Throttling", ThrottledError, 400),
    ("UnauthorizedOperation", AuthError, 403),
    ("AuthFailure", AuthError, 401),
    ("InvalidParameterValue", ProviderError, 400),
]


def _client_error(code: str, status: int, method: str = "run_instances") -> Exception:
    """The exception botocore raises for `code`, produced by a Stubber-driven call."""
    session = StubSession()
    stub = session.stub("ec2")
    stub.add_client_error(
        method, service_error_code=code, service_message=f"{code} here", http_status_code=status
    )
    client = session.client("ec2", "us-east-1")
    with pytest.raises(Exception) as caught:
        if method == "run_instances":
            client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)
        else:
            client.describe_instances()
    return caught.value


@pytest.mark.parametrize(("code", "cls", "status"), CODES)
def test_each_aws_code_becomes_its_typed_error(
    code: str, cls: type[ProviderError], status: int
) -> None:
    error = translate(_client_error(code, status), zone=ZONE)
    assert type(error) is cls
    assert error.code == code and error.provider == "aws"
    assert code in str(error) and "RunInstances" in str(error)


@pytest.mark.parametrize(("code", "cls", "status"), CODES)
def test_only_capacity_errors_are_scoped_to_the_zone(
    code: str, cls: type[ProviderError], status: int
) -> None:
    error = translate(_client_error(code, status), zone=ZONE)
    assert error.zone == (ZONE if cls is CapacityError else None)


def test_unsupported_type_in_a_zone_blocks_that_zone_only() -> None:
    error = translate(_client_error("Unsupported", 400), zone="euw1-az3")
    assert isinstance(error, CapacityError) and error.zone == "euw1-az3"


def test_pricing_throttling_exception_is_throttling() -> None:
    session = StubSession()
    stub = session.stub("pricing")
    stub.add_client_error(
        "get_products", service_error_code="ThrottlingException", http_status_code=400
    )
    with pytest.raises(Exception) as caught:
        session.client("pricing", "us-east-1").get_products(ServiceCode="AmazonEC2")
    assert isinstance(translate(caught.value), ThrottledError)


def _isolated_session(**env: Any) -> Any:
    import boto3

    return boto3.session.Session(region_name="us-east-1", **env)


def test_missing_credentials_are_an_auth_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import NoCredentialsError

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    client = _isolated_session().client("ec2")
    with pytest.raises(NoCredentialsError) as caught:
        client.describe_regions()
    error = translate(caught.value)
    assert isinstance(error, AuthError) and error.code == "NoCredentialsError"
    assert "credentials" in str(error)


def test_unreachable_endpoint_is_a_provider_error() -> None:
    from botocore.config import Config
    from botocore.exceptions import EndpointConnectionError

    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    client = _isolated_session().client(
        "ec2", endpoint_url="http://127.0.0.1:9", config=Config(retries={"max_attempts": 1})
    )
    with pytest.raises(EndpointConnectionError) as caught:
        client.describe_regions()
    error = translate(caught.value)
    assert type(error) is ProviderError and "cannot reach AWS" in str(error)


def test_typed_errors_pass_through_and_strangers_are_wrapped() -> None:
    original = QuotaError("already typed", provider="aws", code="VcpuLimitExceeded")
    assert translate(original) is original
    wrapped = translate(RuntimeError("boom"))
    assert type(wrapped) is ProviderError and "RuntimeError: boom" in str(wrapped)


def test_without_credentials_aws_is_disabled_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    reason = aws_disabled_reason()
    assert reason is not None and "\n" not in reason
    assert "no AWS credentials" in reason and "AWS_PROFILE" in reason
    assert AwsProvider.disabled_reason() == reason
    with pytest.raises(ProviderDisabled, match="no AWS credentials"):
        AwsProvider(["us-east-1"]).fetch_offers()


def test_with_credentials_aws_is_enabled() -> None:
    assert aws_disabled_reason() is None


def test_importing_the_provider_does_not_load_boto3() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, providers.aws\n"
        "print('LOADED', [m for m in ('boto3', 'botocore') if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert "LOADED []" in done.stdout, done.stdout + done.stderr
