"""The AWS provider: live GPU prices, per-zone availability, spot launches, interruptions.

Importing this package does not import boto3; clients are made on first use.
"""

from providers.aws.clients import aws_disabled_reason
from providers.aws.errors import translate
from providers.aws.launch import AwsLaunchConfig, client_token
from providers.aws.provider import AwsProvider
from providers.aws.queue import InterruptionEvent, parse_event

__all__ = [
    "AwsLaunchConfig",
    "AwsProvider",
    "InterruptionEvent",
    "aws_disabled_reason",
    "client_token",
    "parse_event",
    "translate",
]
