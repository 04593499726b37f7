"""The GCP provider's section of the daemon config (`providers.gcp`)."""

from __future__ import annotations

from pydantic import Field

from providers.config import ProviderConfig
from providers.gcp.settings import PROJECT_ENV


class GcpConfig(ProviderConfig):
    """GCP: the common keys and the project."""

    project: str | None = Field(None, description=f"The project ({PROJECT_ENV}).")
