"""The GCP adapter: Compute Engine GPU offers priced from the Cloud Billing Catalog, Spot VMs.

Importing this package loads no Google SDK; the clients are made on first use.
"""

from optimizer import hardware
from providers.base import ProviderSettings
from providers.facts import BillingRule, FocusNames
from providers.gcp.config import GcpConfig
from providers.gcp.offers import SOURCE
from providers.gcp.provider import GcpProvider, make_gcp_provider
from providers.gcp.settings import GcpSettings, gcp_disabled_reason
from providers.registry import Capabilities, ProviderEntry

__all__ = [
    "BILLING",
    "ENTRY",
    "SOURCE",
    "GcpConfig",
    "GcpProvider",
    "GcpSettings",
    "build",
    "gcp_disabled_reason",
    "make_gcp_provider",
]


def build(settings: ProviderSettings) -> GcpProvider:
    """The provider for the daemon's `providers.gcp` settings over the `GPUOPT_GCP_*`
    environment (the registry's builder); ProviderDisabled while GCP cannot run here."""
    config = settings.config if isinstance(settings.config, GcpConfig) else GcpConfig()
    gcp = GcpSettings.from_env(project=config.project, regions=settings.regions or None)
    return make_gcp_provider(
        gcp, cache=settings.cache, clock=settings.clock, commitments=settings.commitments
    )


# Compute Engine: per-second billing with a 1-minute minimum for vCPUs, memory and GPUs
# (Google's 2017 announcement, quoted secondhand); a Spot VM preempted within its first minute
# is not charged (the Spot VMs page, quoted secondhand). No first-hour credit. Root volume:
# pd-balanced at $0.10 per GB-month in us-central1, prorated by the second (the Cloud Billing
# Catalog as compiled in a public pricing table, 2025-03-06), the list price of one region
# used for every region until the adapter reads storage SKUs.
BILLING = BillingRule(
    minimum_s=60.0, interrupted_free_s=60.0, disk_usd_per_gib_month=0.10, disk_type="pd-balanced"
)

# The GCP provider, as the `gpuopt.providers` entry point `gcp` names it.
ENTRY = ProviderEntry(
    "gcp",
    Capabilities(
        launch=True,
        live_offers=True,
        commitments=True,
        gang_placement=True,
        watcher="gcp-metadata",
    ),
    build,
    ("GPUOPT_GCP_BILLING_API_KEY",),
    settings=GcpConfig,
    billing=BILLING,
    hardware=hardware.GCP_FACTS,
    focus=FocusNames("Google Cloud", "Compute Engine", "Compute Engine"),
)
