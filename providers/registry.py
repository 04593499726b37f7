"""The provider registry: what each provider can do and knows, declared once, and how it is built.

Each provider is one `ProviderEntry`: its name, its `Capabilities`, its builder (a
`ProviderSettings` → source function), the model of its section of the daemon config, its
billing rule, its hardware facts and its names in a FOCUS cost export. The entries are found
through the `gpuopt.providers` entry-point group: gpuopt's own (`local`, `aws`, `gcp`) are
declared in its pyproject.toml, and another installed package adds one the same way, with no
edit to gpuopt (docs/extending.md, "A provider"). The daemon's poll, queue and reconcile
loops, `gpuopt offers --provider`, the bootstrap that starts the agent on a new instance, the
cost ledger and the policy loader ask this registry; none of them probes a source's
attributes, and a name no provider has is a RegistryError listing the installed ones.

A declared capability is a promise about the built source's type: `launch` means it is a
`Launcher` (launch, describe, terminate, close), `interruption_queue` an
`InterruptionQueue`, `gang_placement` a `PlacementOwner`, `hosted` a `HostedCloud`. The
lookups (`ProviderEntry.launcher`, `.interruption_queue`, `.placement_owner`, `.hosted`)
return the source under that type, or None when the provider does not declare it;
tests/test_provider_registry.py checks each installed provider implements what it declares.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

from optimizer.common import plugins
from optimizer.hardware import HardwareFacts
from providers.base import (
    HostedCloud,
    InterruptionQueue,
    OffersNotifier,
    OfferSource,
    PlacementOwner,
    Provider,
    ProviderSettings,
)
from providers.config import ProviderConfig
from providers.facts import BillingRule, FocusNames

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
    markets: tuple[str, ...] = ("spot", "on_demand")  # the markets its offers are polled in
    # (one poll loop each): owned machines (providers/ssh) offer the `owned` market alone
    offers_follow_launches: bool = False  # its offers are what is free now, which its own
    # launches and ends change (owned machines): the source is an OffersNotifier
    hosted: bool = False  # the cloud runs inside the leading daemon (the local cloud's
    # metadata endpoint and power-off ticker): a replica that takes over resumes it at once
    # for the running instances, since it died with the last leader: the source is a
    # HostedCloud


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    """One provider: its name, what it can do and how it is built from its settings.

    `build` raises ProviderDisabled (one line why) while the provider cannot run here.
    `secret_env` names the environment variables holding its credentials, kept out of
    error texts and logs. `settings` is the model of its `providers.<name>` config section
    (the common keys, or a subclass with its own); `billing`, `hardware` and `focus` are what
    it knows about its cloud, each asked through `billing_rule()`, `hardware_facts()` and
    `focus_names()`, which name the provider when it declares none.
    """

    name: str
    capabilities: Capabilities
    build: Callable[[ProviderSettings], OfferSource]
    secret_env: tuple[str, ...] = field(default=())
    settings: type[ProviderConfig] = ProviderConfig
    billing: BillingRule | None = None
    hardware: HardwareFacts | None = None
    focus: FocusNames | None = None

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

    def billing_rule(self) -> BillingRule:
        """How the provider bills an instance and its root volume."""
        if self.billing is None:
            raise RegistryError(f"provider {self.name!r} declares no billing rule")
        return self.billing

    def hardware_facts(self) -> HardwareFacts:
        """The interconnect and fabric of the provider's instance types."""
        if self.hardware is None:
            raise RegistryError(f"provider {self.name!r} declares no hardware facts")
        return self.hardware

    def focus_names(self) -> FocusNames:
        """The provider's names in a FOCUS cost export."""
        if self.focus is None:
            raise RegistryError(f"provider {self.name!r} declares no FOCUS names")
        return self.focus

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

    def offers_notifier(self, source: OfferSource) -> OffersNotifier | None:
        """`source` as an OffersNotifier when this provider declares
        `offers_follow_launches`, else None."""
        return cast(OffersNotifier, source) if self.capabilities.offers_follow_launches else None

    def placement_owner(self, source: OfferSource) -> PlacementOwner | None:
        """`source` as a PlacementOwner when this provider declares `gang_placement`, else
        None."""
        return cast(PlacementOwner, source) if self.capabilities.gang_placement else None


def _check(entry: ProviderEntry, name: str) -> None:
    if entry.name != name:
        raise plugins.PluginError(
            f"entry point {plugins.PROVIDERS} {name}: names provider {entry.name!r}"
        )


_TABLE = plugins.Table(
    plugins.PROVIDERS,
    ProviderEntry,
    _check,
    what="provider",
    error=RegistryError,
    required=(
        f"no provider is installed: the {plugins.PROVIDERS} entry points are missing "
        "(install gpuopt, or reinstall a checkout: pip install -e .)"
    ),
)
_load = _TABLE.all
reload = _TABLE.reload


def register(entry: ProviderEntry) -> ProviderEntry:
    """Add a provider in this process (tests; an installed package declares an entry point
    instead); its name must be free."""
    return _TABLE.register(entry.name, entry)


def unregister(name: str) -> None:
    """Remove a provider registered in this process."""
    _TABLE.unregister(name)


@contextmanager
def registered(entry: ProviderEntry) -> Iterator[ProviderEntry]:
    """`entry` registered for the length of a `with` block."""
    with _TABLE.registered(entry.name, entry):
        yield entry


def names() -> tuple[str, ...]:
    """Every provider, in the order found."""
    return tuple(_load())


def entries() -> Mapping[str, ProviderEntry]:
    return dict(_load())


def find(name: str) -> ProviderEntry | None:
    return _load().get(name)


def on_host(name: str) -> bool:
    """Whether the provider's instances run on this host (`agent_on_host`): what they measure
    and read is this host's GPU, not the type they name. False for an unknown provider."""
    entry = find(name)
    return entry is not None and entry.capabilities.agent_on_host


def get(name: str) -> ProviderEntry:
    """The provider's entry; RegistryError naming the installed ones otherwise."""
    entry = _load().get(name)
    if entry is None:
        raise RegistryError(f"unknown provider {name!r}; installed: {', '.join(_load())}")
    return entry


def capabilities(name: str) -> Capabilities:
    return get(name).capabilities


def build(name: str, settings: ProviderSettings) -> OfferSource:
    """The provider's source for `settings`; ProviderDisabled while it cannot run here."""
    return get(name).build(settings)


def secret_env() -> tuple[str, ...]:
    """Every provider's credential variables."""
    return tuple(name for entry in _load().values() for name in entry.secret_env)
