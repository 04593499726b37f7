"""A provider's section of the daemon config (`providers.<name>` in gpuopt.yaml, or the
`GPUOPT_PROVIDERS__<NAME>__<KEY>` variables): the keys every provider has. A provider with
settings of its own declares a subclass in its package and names it in its registry entry
(`ProviderEntry.settings`); the daemon config validates each section with its provider's
model, so a key another provider owns is refused where it is written."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from optimizer.common.bounds import Seconds


class ProviderConfig(BaseModel):
    """One provider's polling. Regions empty = every region the provider knows."""

    # Numbers are bounded (optimizer/common/bounds.py); NaN and infinity are never one.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = True
    regions: list[str] = Field(default_factory=list, examples=[["us-east-1", "eu-west-1"]])
    spot_interval_s: Seconds = Field(600, ge=1, description="Spot prices: every 10 minutes.")
    on_demand_interval_s: Seconds = Field(
        86_400, ge=1, description="On-demand prices and specs: daily."
    )

    @property
    def interruption_queue_configured(self) -> bool:
        """Whether this section names an interruption queue to read (a provider with one
        declares the key in its own model)."""
        return False
