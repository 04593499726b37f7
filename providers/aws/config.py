"""The AWS provider's section of the daemon config (`providers.aws`)."""

from __future__ import annotations

from pydantic import Field

from providers.config import ProviderConfig


class AwsConfig(ProviderConfig):
    """AWS: the common keys, placement scores and the interruption queue."""

    placement_scores: bool = Field(False, description="Fetch spot placement scores.")
    interruption_queue_url: str | None = Field(
        None, description="The SQS queue EventBridge sends EC2 interruption events to."
    )

    @property
    def interruption_queue_configured(self) -> bool:
        return bool(self.interruption_queue_url)
