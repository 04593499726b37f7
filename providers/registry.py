"""The provider registry: what each provider can do, declared once, and how it is built.

Each provider is one `ProviderEntry`: its name, its `Capabilities` and its builder (a
`ProviderSettings` → source function, kept in the provider's own package). The daemon's
poll, queue and reconcile loops, `gpuopt offers --provider` and the bootstrap that starts
the agent on a new instance ask this registry what a provider can do; none of them probes a
source's attributes. Adding a provider is a new `providers/<name>/` package, one `register`
line at the bottom of this module and the provider's rows in `policies/regions.csv`
(docs/architecture.md, "Provider registry").

A declared capability is a promise about the built source's type: `launch` means it is a
`Launcher` (launch, describe, terminate, close), `interruption_queue` an
`InterruptionQueue`, `gang_placement` a `PlacementOwner`, `hosted` a `HostedCloud`. The
lookups (`ProviderEntry.launcher`, `.interruption_queue`, `.placement_owner`, `.hosted`)
return the source under that type, or None when the provider does not declare it;
tests/test_provider_registry.py checks each built-in provider implements what it declares.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

from providers import aws, gcp, local
from providers.base import (
    HostedCloud,
    InterruptionQueue,
    OfferSource,
    PlacementOwner,
    Provider,
    ProviderSettings,
)

NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
# A metadata watcher kind names the metadata endpoint an instance's agent watches for
# interruption notices (optimizer/agent/imds.py maps each kind to a watcher).
WATCHER_KIND = re.compile(r"^[a-z][a-z0-9-]*$")


class RegistryError(ValueError):
    """A provider entry that cannot be registered, or a name no provider has."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a provider can do beyond fetching offers (which every provider does)."""

    launch: bool = False  # launch, describe and terminate instances: the source is a Launcher
    interruption_queue: bool = False  # read interruptions from an event queue when one is
    # configured (`interruption_queue_url`): the source is an InterruptionQueue
    placement_scores: bool = False  # fetch spot placement scores when asked (`placement_scores`)
    commitments: bool = False  # fetch committed offers (1- and 3-year commitment rates) when
    # asked (`commitments`): `gpuopt tco`, and `gpuopt offers` when the committed market is wanted
    live_offers: bool = False  # `gpuopt offers --provider NAME` asks it live (else its
    # snapshot rows); the local cloud's live offers are its simulated prices of the moment
    gang_placement: bool = False  # makes a placement for each gang it launches
    # (`LaunchSpec.gang`) and deletes it once the gang is over: the source is a PlacementOwner
    watcher: str | None = None  # the metadata watcher kind its instances' agent runs
    agent_on_host: bool = False  # its instances run on this host with this gpuopt: the
    # bootstrap installs nothing and starts the agent with this interpreter
    hosted: bool = False  # the cloud runs inside the leading daemon (the local cloud's
    # metadata endpoint and power-off ticker): a replica that takes over resumes it at once
    # for the running instances, since it died with the last leader: the source is a
    # HostedCloud


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    """One provider: its name, what it can do and how it is built from its settings.

    `build` raises ProviderDisabled (one line why) while the provider cannot run here.
    `secret_env` names the environment variables holding its credentials, kept out of
    error texts and logs.
    """

    name: str
    capabilities: Capabilities
    build: Callable[[ProviderSettings], OfferSource]
    secret_env: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        where = f"provider {self.name!r}"
        if not NAME.match(self.name):
            raise RegistryError(f"{where}: a name is 1-32 lowercase letters, digits and dashes")
        kind = self.capabilities.watcher
        if kind is not None and not WATCHER_KIND.match(kind):
            raise RegistryError(f"{where}: watcher kind {kind!r} is not a lowercase word")
        if self.capabilities.launch and kind is None:
            raise RegistryError(
                f"{where}: a provider that launches must name the metadata watcher kind its "
                "instances' agent runs (Capabilities.watcher)"
            )

    def launcher(self, source: OfferSource) -> Provider | None:
        """`source` as a Provider (offers and a Launcher) when this provider declares
        `launch`, else None."""
        return cast(Provider, source) if self.capabilities.launch else None

    def interruption_queue(self, source: OfferSource) -> InterruptionQueue | None:
        """`source` as an InterruptionQueue when this provider declares one, else None."""
        return cast(InterruptionQueue, source) if self.capabilities.interruption_queue else None

    def hosted(self, source: OfferSource) -> HostedCloud | None:
        """`source` as a HostedCloud when this provider declares `hosted`, else None."""
        return cast(HostedCloud, source) if self.capabilities.hosted else None

    def placement_owner(self, source: OfferSource) -> PlacementOwner | None:
        """`source` as a PlacementOwner when this provider declares `gang_placement`, else
        None."""
        return cast(PlacementOwner, source) if self.capabilities.gang_placement else None


_ENTRIES: dict[str, ProviderEntry] = {}


def register(entry: ProviderEntry) -> ProviderEntry:
    """Add a provider; its name must be free."""
    if entry.name in _ENTRIES:
        raise RegistryError(f"provider {entry.name!r} is already registered")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove a provider (tests that register one of their own)."""
    _ENTRIES.pop(name, None)


@contextmanager
def registered(entry: ProviderEntry) -> Iterator[ProviderEntry]:
    """`entry` registered for the length of a `with` block."""
    register(entry)
    try:
        yield entry
    finally:
        unregister(entry.name)


def names() -> tuple[str, ...]:
    """Every registered provider, in registration order."""
    return tuple(_ENTRIES)


def entries() -> Mapping[str, ProviderEntry]:
    return dict(_ENTRIES)


def find(name: str) -> ProviderEntry | None:
    return _ENTRIES.get(name)


def get(name: str) -> ProviderEntry:
    """The provider's entry; RegistryError naming the known ones otherwise."""
    entry = _ENTRIES.get(name)
    if entry is None:
        raise RegistryError(f"unknown provider {name!r}; known: {', '.join(_ENTRIES)}")
    return entry


def capabilities(name: str) -> Capabilities:
    return get(name).capabilities


def build(name: str, settings: ProviderSettings) -> OfferSource:
    """The provider's source for `settings`; ProviderDisabled while it cannot run here."""
    return get(name).build(settings)


def secret_env() -> tuple[str, ...]:
    """Every registered provider's credential variables."""
    return tuple(name for entry in _ENTRIES.values() for name in entry.secret_env)


# The built-in providers: one `register` each.
register(
    ProviderEntry(
        "local",
        Capabilities(
            launch=True, live_offers=True, watcher="aws-imds", agent_on_host=True, hosted=True
        ),
        local.build,
    )
)
register(
    ProviderEntry(
        "aws",
        Capabilities(
            launch=True,
            interruption_queue=True,
            placement_scores=True,
            live_offers=True,
            commitments=True,
            gang_placement=True,
            watcher="aws-imds",
        ),
        aws.build,
        ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    )
)
register(
    ProviderEntry(
        "gcp",
        Capabilities(
            launch=True,
            live_offers=True,
            commitments=True,
            gang_placement=True,
            watcher="gcp-metadata",
        ),
        gcp.build,
        ("GPUOPT_GCP_BILLING_API_KEY",),
    )
)
