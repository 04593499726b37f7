"""The GCP adapter: Compute Engine GPU offers priced from the Cloud Billing Catalog, Spot VMs.

Importing this package loads no Google SDK; the clients are made on first use.
"""

from providers.gcp.offers import SOURCE
from providers.gcp.provider import GcpProvider, make_gcp_provider
from providers.gcp.settings import GcpSettings, gcp_disabled_reason

__all__ = [
    "SOURCE",
    "GcpProvider",
    "GcpSettings",
    "gcp_disabled_reason",
    "make_gcp_provider",
]
