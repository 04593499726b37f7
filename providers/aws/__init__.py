"""The AWS provider: live GPU prices, per-zone availability, spot launches, interruptions.

Importing this package does not import boto3; clients are made on first use.
"""

from providers.aws.clients import aws_disabled_reason
from providers.aws.errors import translate
from providers.aws.launch import AwsLaunchConfig, client_token
from providers.aws.provider import AwsProvider
from providers.aws.queue import parse_event
from providers.base import InterruptionEvent, ProviderDisabled, ProviderSettings

__all__ = [
    "AwsLaunchConfig",
    "AwsProvider",
    "InterruptionEvent",
    "aws_disabled_reason",
    "build",
    "client_token",
    "parse_event",
    "translate",
]


def build(settings: ProviderSettings) -> AwsProvider:
    """The provider for the daemon's `providers.aws` settings (the registry's builder);
    ProviderDisabled while no AWS credentials are found."""
    reason = aws_disabled_reason()
    if reason:
        raise ProviderDisabled(reason, provider="aws")
    return AwsProvider(
        settings.regions or None,
        cache=settings.cache,
        clock=settings.clock,
        placement_scores=settings.placement_scores,
        queue_url=settings.interruption_queue_url,
        commitments=settings.commitments,
    )
