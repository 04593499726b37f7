"""The `alerts:` section of the daemon config: channels, routes and delivery retries.

URLs and secrets are `SecretStr`: they print as `**********` in reprs, logs and
`gpuopt config show`, and validation messages never repeat them.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from optimizer.alerts.channel import check_url
from optimizer.alerts.channels import CHANNEL_TYPES, secret_problem
from optimizer.alerts.routing import Route
from optimizer.common.bounds import Hours, Seconds

CHANNEL_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MIN_SECRET_CHARS = 16
# The shape of the section, for error messages and the schema (not a working webhook).
_CHANNELS_EXAMPLE = {"ops": {"type": "slack", "url": "https://hooks.slack.com/services/T0/B0/x"}}
_ROUTES_EXAMPLE = [{"kinds": ["job_*"], "min_severity": "warning", "channels": ["ops"]}]
ALERTS_EXAMPLE = {"channels": _CHANNELS_EXAMPLE, "routes": _ROUTES_EXAMPLE}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _usable_url(value: SecretStr) -> SecretStr:
    problem = check_url(value.get_secret_value())
    if problem:
        raise ValueError(problem)
    return value


class ChannelConfig(_Section):
    """One alert destination: a Slack incoming webhook (`type: slack`) or any HTTP endpoint
    that receives signed JSON (`type: webhook`, which needs the shared `secret`); the types
    are those of `alerts/channels.py`."""

    type: str
    url: SecretStr
    secret: SecretStr | None = Field(
        None, description=f"webhook only: shared HMAC secret, >= {MIN_SECRET_CHARS} characters."
    )

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in CHANNEL_TYPES:
            known = ", ".join(sorted(CHANNEL_TYPES))
            raise ValueError(f"unknown channel type {value!r}; known types: {known}")
        return value

    @field_validator("url")
    @classmethod
    def _usable_url(cls, value: SecretStr) -> SecretStr:
        problem = check_url(value.get_secret_value())
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_SECRET_CHARS:
            raise ValueError(f"must be at least {MIN_SECRET_CHARS} characters")
        return value

    @model_validator(mode="after")
    def _secret_fits_type(self) -> ChannelConfig:
        problem = secret_problem(self.type, self.secret is not None)
        if problem:
            raise ValueError(problem)
        return self


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
    channels: dict[str, ChannelConfig] = Field(default_factory=dict, examples=[_CHANNELS_EXAMPLE])
    routes: list[Route] = Field(default_factory=list, examples=[_ROUTES_EXAMPLE])
    retry: RetryConfig = Field(default_factory=RetryConfig, examples=[{"max_attempts": 12}])

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
        out: list[str] = []
        for channel in self.channels.values():
            out.append(channel.url.get_secret_value())
            if channel.secret is not None:
                out.append(channel.secret.get_secret_value())
        return out
