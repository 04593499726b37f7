"""The alert channel types a daemon config may name, found through the `gpuopt.alert_channels`
entry points.

A channel type is one `ChannelType`: its name (the `type:` a config entry gives), the model
of its config entry (a `ChannelConfig` subclass: the keys it takes, validated where they are
written) and its builder (name, config, HTTP client, clock → a `Notifier`). gpuopt's own
(`slack`, `webhook`) are declared in its pyproject.toml; another installed package adds one
the same way (docs/extending.md, "An alert channel"), with no edit to gpuopt. The config
validates each `alerts.channels` entry with its type's model, and the daemon builds each
configured channel through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from optimizer.alerts.channel import Notifier, check_url
from optimizer.clock import Clock
from optimizer.common import plugins
from optimizer.common.validation import SectionError

MIN_SECRET_CHARS = 16


class ChannelConfig(BaseModel):
    """One `alerts.channels` entry: its `type`, and the keys its channel type declares in a
    subclass. `secrets()` lists the values to keep out of logs and API answers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    type: str

    def secrets(self) -> list[str]:
        return []

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> ChannelConfig:
        """An entry validated with the model its `type` names."""
        return channel_model(raw).model_validate(raw)


class UrlChannelConfig(ChannelConfig):
    """An entry that posts to a URL (a credential itself: kept secret), with a shared secret
    where the type signs its bodies (`needs_secret`)."""

    needs_secret: ClassVar[bool] = False  # True: `secret` is required; False: refused
    secret_note: ClassVar[str] = ""  # why, shown when the config gets `secret` wrong

    url: SecretStr
    secret: SecretStr | None = Field(
        None, description=f"webhook: the shared HMAC secret, >= {MIN_SECRET_CHARS} characters."
    )

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
    def _secret_fits_type(self) -> UrlChannelConfig:
        if self.needs_secret and self.secret is None:
            raise ValueError(f"a {self.type} channel needs `secret` ({self.secret_note})")
        if not self.needs_secret and self.secret is not None:
            raise ValueError(f"a {self.type} channel takes no `secret` ({self.secret_note})")
        return self

    def secrets(self) -> list[str]:
        found = [self.url.get_secret_value()]
        if self.secret is not None:
            found.append(self.secret.get_secret_value())
        return found


Builder = Callable[[str, Any, httpx.Client, Clock], Notifier]


@dataclass(frozen=True, slots=True)
class ChannelType:
    """One kind of destination: the model of its config entry and how it is built (the
    builder gets the entry validated with `config`)."""

    name: str
    config: type[ChannelConfig]
    build: Builder


def _check(kind: ChannelType, name: str) -> None:
    if kind.name != name:
        raise plugins.PluginError(
            f"entry point {plugins.ALERT_CHANNELS} {name}: names channel type {kind.name!r}"
        )


_TABLE = plugins.Table(
    plugins.ALERT_CHANNELS, ChannelType, _check, what="channel type", error=ValueError
)
reload = _TABLE.reload


def channel_types() -> Mapping[str, ChannelType]:
    """The channel types by name, the installed ones read from their entry points once."""
    return _TABLE.all()


@contextmanager
def registered(kind: ChannelType) -> Iterator[ChannelType]:
    """A channel type registered in this process for the length of a `with` block (tests;
    an installed package declares an entry point instead)."""
    with _TABLE.registered(kind.name, kind):
        yield kind


def channel_model(raw: Any) -> type[ChannelConfig]:
    """The config model of the type an entry names; SectionError at `type` otherwise."""
    name = raw.get("type") if isinstance(raw, Mapping) else None
    kind = channel_types().get(name) if isinstance(name, str) else None
    if kind is None:
        known = ", ".join(sorted(channel_types())) or "none is installed"
        if name is None:
            raise SectionError(f"`type` is missing; known types: {known}", ("type",))
        raise SectionError(f"unknown channel type {name!r}; known types: {known}", ("type",))
    return kind.config


def build_notifiers(
    channels: Mapping[str, ChannelConfig], client: httpx.Client, clock: Clock
) -> dict[str, Notifier]:
    """One notifier per configured channel, by name."""
    types = channel_types()
    return {
        name: types[spec.type].build(name, spec, client, clock) for name, spec in channels.items()
    }
