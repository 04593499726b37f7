"""AWS error codes → gpuopt's typed provider errors, in one place.

Sources for the codes: the EC2 API error reference
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html), the Price List
and SQS API references for their throttling/auth codes, and Karpenter's classification
(`aws/karpenter-provider-aws:pkg/errors/errors.go`) as summarised in REFERENCE.md §1.6.
"""

from __future__ import annotations

from providers.base import (
    AuthError,
    CapacityError,
    PriceTooLowError,
    ProviderError,
    QuotaError,
    ThrottledError,
)

PROVIDER = "aws"

# No capacity for the type in that zone; the zone-scoped codes block (type, zone), not the region.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",  # on-demand or spot: none left in that AZ
        "InsufficientCapacity",
        "UnfulfillableCapacity",  # fleet: not enough spare spot capacity
        "InsufficientHostCapacity",
        "Unsupported",  # the type (or configuration) is not sold in that AZ
        "InsufficientFreeAddressesInSubnet",  # the zone's subnet is full
        "ReservationCapacityExceeded",
    }
)
QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",  # on-demand vCPU quota (L-DB2E81BA, L-417A185B …)
        "MaxSpotInstanceCountExceeded",  # spot vCPU quota: running plus open requests
        "InstanceLimitExceeded",
        "MaxFleetCountExceeded",
    }
)
PRICE_CODES = frozenset({"SpotMaxPriceTooLow"})  # MaxPrice below the current spot price
THROTTLE_CODES = frozenset(
    {
        "RequestLimitExceeded",  # EC2: per account and region token buckets
        "Throttling",  # Query-protocol services
        "ThrottlingException",  # JSON-protocol services (Price List)
        "TooManyRequestsException",
        "RequestThrottled",  # SQS
        "RequestThrottledException",
    }
)
AUTH_CODES = frozenset(
    {
        "UnauthorizedOperation",  # EC2: the IAM policy lacks the action
        "AuthFailure",  # EC2: bad keys, or an opt-in region not enabled in the account
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "UnrecognizedClientException",
        "OptInRequired",
        "IncompleteSignature",
        "MissingAuthenticationToken",
    }
)

_BY_CODE: dict[str, type[ProviderError]] = {
    **dict.fromkeys(CAPACITY_CODES, CapacityError),
    **dict.fromkeys(QUOTA_CODES, QuotaError),
    **dict.fromkeys(PRICE_CODES, PriceTooLowError),
    **dict.fromkeys(THROTTLE_CODES, ThrottledError),
    **dict.fromkeys(AUTH_CODES, AuthError),
}

NO_CREDENTIALS = (
    "no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
    "run `aws configure`, or attach an instance role)"
)


def error_class(code: str) -> type[ProviderError]:
    """The typed error an AWS error code maps to; ProviderError for codes not listed."""
    return _BY_CODE.get(code, ProviderError)


def translate(error: Exception, *, zone: str | None = None) -> ProviderError:
    """The typed error for anything boto3/botocore raised; `zone` scopes capacity errors.

    A ProviderError passes through unchanged. Only capacity errors carry the zone: a quota,
    throttle or auth failure is about the account or the region, never one zone.
    """
    if isinstance(error, ProviderError):
        return error
    from botocore import exceptions as bx

    if isinstance(error, bx.ClientError):
        body = error.response.get("Error", {})
        code = str(body.get("Code") or "")
        message = str(body.get("Message") or "") or str(error)
        cls = error_class(code)
        operation = getattr(error, "operation_name", "") or ""
        where = f" ({operation})" if operation else ""
        return cls(
            f"{code}{where}: {message}",
            provider=PROVIDER,
            code=code,
            zone=zone if cls is CapacityError else None,
        )
    if isinstance(error, bx.NoCredentialsError | bx.PartialCredentialsError):
        return AuthError(NO_CREDENTIALS, provider=PROVIDER, code=type(error).__name__)
    if isinstance(error, bx.CredentialRetrievalError):
        return AuthError(str(error), provider=PROVIDER, code=type(error).__name__)
    if isinstance(error, bx.EndpointConnectionError | bx.ConnectionError | bx.HTTPClientError):
        return ProviderError(
            f"cannot reach AWS: {error}", provider=PROVIDER, code=type(error).__name__
        )
    if isinstance(error, bx.BotoCoreError):
        return ProviderError(str(error), provider=PROVIDER, code=type(error).__name__)
    return ProviderError(f"{type(error).__name__}: {error}", provider=PROVIDER)
