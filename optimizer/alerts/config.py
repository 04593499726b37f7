"""The `alerts:` section of the daemon config: channels, routes and delivery retries.

URLs and secrets are `SecretStr`: they print as `**********` in reprs, logs and
`gpuopt config show`, and validation messages never repeat them.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    field_validator,
    model_validator,
)

from optimizer.alerts.channels import ChannelConfig, channel_model
from optimizer.alerts.routing import Route
from optimizer.common.bounds import Hours, Seconds
from optimizer.common.validation import validate_each

CHANNEL_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
# The shape of the section, for error messages and the schema (not a working webhook).
_CHANNELS_EXAMPLE = {"ops": {"type": "slack", "url": "https://hooks.slack.com/services/T0/B0/x"}}
_ROUTES_EXAMPLE = [{"kinds": ["job_*"], "min_severity": "warning", "channels": ["ops"]}]
ALERTS_EXAMPLE = {"channels": _CHANNELS_EXAMPLE, "routes": _ROUTES_EXAMPLE}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RetryConfig(_Section):
    """Exponential back-off with jitter: attempt n waits base_s x 2^(n-1), capped at max_s,
    times a random factor in [0.5, 1]; an alert fails after max_attempts or max_age_hours."""

    max_attempts: int = Field(12, ge=1, le=100)
    max_age_hours: Hours = Field(24, gt=0)
    base_s: Seconds = Field(5, gt=0)
    max_s: Seconds = Field(900, gt=0)
    timeout_s: float = Field(10, gt=0, le=120)
    batch: int = Field(50, ge=1, le=1000)


class AlertsConfig(_Section):
    channels: dict[str, SerializeAsAny[ChannelConfig]] = Field(
        default_factory=dict, examples=[_CHANNELS_EXAMPLE]
    )
    routes: list[Route] = Field(default_factory=list, examples=[_ROUTES_EXAMPLE])
    retry: RetryConfig = Field(default_factory=RetryConfig, examples=[{"max_attempts": 12}])

    @field_validator("channels", mode="before")
    @classmethod
    def _each_with_its_types_model(cls, value: Any) -> Any:
        """Each entry validated with the config model its `type` declares."""
        return validate_each("channels", value, lambda _name, raw: channel_model(raw))

    @field_validator("channels")
    @classmethod
    def _names(cls, value: dict[str, ChannelConfig]) -> dict[str, ChannelConfig]:
        for name in value:
            if not re.fullmatch(CHANNEL_NAME, name):
                raise ValueError(
                    f"channel name {name!r} must be lowercase letters, digits, - and _"
                )
        return value

    @model_validator(mode="after")
    def _known_channels(self) -> AlertsConfig:
        for i, route in enumerate(self.routes):
            for name in route.channels or ():
                if name not in self.channels:
                    known = ", ".join(self.channels) or "none configured"
                    raise ValueError(
                        f"routes[{i}] names channel {name!r}, which is not configured "
                        f"(channels: {known})"
                    )
        return self

    def secrets(self) -> list[str]:
        """Every URL and secret, for redaction."""
        return [value for channel in self.channels.values() for value in channel.secrets()]
