"""The AWS provider: live GPU prices, per-zone availability, spot launches, interruptions.

Importing this package does not import boto3; clients are made on first use.
"""

from optimizer import hardware
from providers.aws.clients import aws_disabled_reason
from providers.aws.config import AwsConfig
from providers.aws.errors import translate
from providers.aws.launch import AwsLaunchConfig, client_token
from providers.aws.provider import AwsProvider
from providers.aws.queue import parse_event
from providers.base import InterruptionEvent, ProviderDisabled, ProviderSettings
from providers.facts import BillingRule, FocusNames
from providers.registry import Capabilities, ProviderEntry

__all__ = [
    "BILLING",
    "ENTRY",
    "AwsConfig",
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
    config = settings.config if isinstance(settings.config, AwsConfig) else AwsConfig()
    return AwsProvider(
        settings.regions or None,
        cache=settings.cache,
        clock=settings.clock,
        placement_scores=config.placement_scores,
        queue_url=config.interruption_queue_url,
        commitments=settings.commitments,
    )


# EC2: per-second billing with a 60-second minimum for Linux On-Demand, Reserved and Spot
# instances, each transition to `running` starting a new minimum
# (repost.aws/knowledge-center/ec2-instance-hour-billing; the EC2 user guide's instance
# lifecycle page). A Spot Instance that Amazon EC2 interrupts within its first hour is not
# charged; one you stop or terminate yourself is charged for the seconds used (the EC2 user
# guide, "Billing for interrupted Spot Instances"). Root volume: gp3 at $0.08 per GB-month in
# us-east-1, per second with a 60 s minimum (EBS pricing page, quoted secondhand), the list
# price of one region used for every region until the adapter reads storage SKUs.
BILLING = BillingRule(
    minimum_s=60.0, interrupted_free_s=3600.0, disk_usd_per_gib_month=0.08, disk_type="gp3"
)

# The AWS provider, as the `gpuopt.providers` entry point `aws` names it.
ENTRY = ProviderEntry(
    "aws",
    Capabilities(
        launch=True,
        interruption_queue=True,
        placement_scores=True,
        live_offers=True,
        commitments=True,
        gang_placement=True,
        watcher="aws-imds",
    ),
    build,
    ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    settings=AwsConfig,
    billing=BILLING,
    hardware=hardware.AWS_FACTS,
    focus=FocusNames(
        "Amazon Web Services", "Amazon Elastic Compute Cloud", "Amazon Elastic Block Store"
    ),
)
