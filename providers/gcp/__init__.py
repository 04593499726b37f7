"""The GCP adapter: Compute Engine GPU offers priced from the Cloud Billing Catalog, Spot VMs.

Importing this package loads no Google SDK; the clients are made on first use.
"""

from providers.base import ProviderSettings
from providers.gcp.offers import SOURCE
from providers.gcp.provider import GcpProvider, make_gcp_provider
from providers.gcp.settings import GcpSettings, gcp_disabled_reason

__all__ = [
    "SOURCE",
    "GcpProvider",
    "GcpSettings",
    "build",
    "gcp_disabled_reason",
    "make_gcp_provider",
]


def build(settings: ProviderSettings) -> GcpProvider:
    """The provider for the daemon's `providers.gcp` settings over the `GPUOPT_GCP_*`
    environment (the registry's builder); ProviderDisabled while GCP cannot run here."""
    gcp = GcpSettings.from_env(project=settings.project, regions=settings.regions or None)
    return make_gcp_provider(
        gcp, cache=settings.cache, clock=settings.clock, commitments=settings.commitments
    )
