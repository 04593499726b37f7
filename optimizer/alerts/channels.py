"""The alert channel types a daemon config may name: one entry per type.

This table is the seam for a new channel (PagerDuty, email, ...): write its notifier (a
class with `name` and `send(alert) -> SendResult`, see `channel.Notifier`), add one
`ChannelType` line below, and document it in docs/alerts.md. The config validates `type`
and `secret` against this table, and the daemon builds each configured channel through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import httpx
from pydantic import SecretStr

from optimizer.alerts.channel import Notifier
from optimizer.alerts.slack import SlackNotifier
from optimizer.alerts.webhook import WebhookNotifier
from optimizer.clock import Clock


class ChannelSpec(Protocol):
    """What a channel type builds from: one validated `alerts.channels` entry."""

    @property
    def type(self) -> str: ...

    @property
    def url(self) -> SecretStr: ...

    @property
    def secret(self) -> SecretStr | None: ...


Builder = Callable[[str, ChannelSpec, httpx.Client, Clock], Notifier]


@dataclass(frozen=True, slots=True)
class ChannelType:
    """One kind of destination: whether it takes a shared secret, and how it is built."""

    name: str
    needs_secret: bool  # True: `secret` is required; False: `secret` is refused
    secret_note: str  # why, shown when the config gets `secret` wrong
    build: Builder


def _slack(name: str, spec: ChannelSpec, client: httpx.Client, clock: Clock) -> Notifier:
    return SlackNotifier(name, spec.url, client, clock=clock)


def _webhook(name: str, spec: ChannelSpec, client: httpx.Client, clock: Clock) -> Notifier:
    if spec.secret is None:  # the config refuses a webhook without one
        raise ValueError(f"webhook channel {name!r} has no secret")
    return WebhookNotifier(name, spec.url, spec.secret, client, clock=clock)


CHANNEL_TYPES: Mapping[str, ChannelType] = MappingProxyType(
    {
        t.name: t
        for t in (
            ChannelType("slack", False, "the URL is the credential", _slack),
            ChannelType("webhook", True, "receivers verify the signature", _webhook),
        )
    }
)


def secret_problem(type_name: str, has_secret: bool) -> str | None:
    """Why `secret` does not fit the channel type (one line), or None."""
    kind = CHANNEL_TYPES[type_name]
    if kind.needs_secret and not has_secret:
        return f"a {kind.name} channel needs `secret` ({kind.secret_note})"
    if not kind.needs_secret and has_secret:
        return f"a {kind.name} channel takes no `secret` ({kind.secret_note})"
    return None


def build_notifiers(
    channels: Mapping[str, ChannelSpec], client: httpx.Client, clock: Clock
) -> dict[str, Notifier]:
    """One notifier per configured channel, by name."""
    return {
        name: CHANNEL_TYPES[spec.type].build(name, spec, client, clock)
        for name, spec in channels.items()
    }
