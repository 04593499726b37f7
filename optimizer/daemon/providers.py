"""The daemon's providers, one handle per configured provider, each built on first use.

What a provider is, can do and is built from comes from the registry
(providers/registry.py): `local` is the embedded local cloud (its state under
`<data dir>/local-cloud`), `aws` and `gcp` the live adapters with the store's prices
repository as their spec cache. One that cannot run here (no credentials, no project) reports
why as ProviderDisabled on every poll, and is built as soon as it can run.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from optimizer.clock import Clock
from optimizer.store import Store
from providers import registry
from providers.base import (
    InterruptionQueue,
    OfferSource,
    Provider,
    ProviderSettings,
    SpecCache,
)
from providers.config import ProviderConfig
from providers.registry import Capabilities, ProviderEntry

log = logging.getLogger(__name__)


def provider_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the providers' credential variables that are set."""
    env = os.environ if environ is None else environ
    return [value for name in registry.secret_env() if (value := env.get(name, "").strip())]


def provider_settings(
    config: ProviderConfig,
    *,
    data_dir: Path | None = None,
    cache: SpecCache | None = None,
    clock: Clock,
) -> ProviderSettings:
    """What the registry builds a provider from: its config section and the daemon's parts."""
    return ProviderSettings(
        regions=tuple(config.regions),
        config=config,
        data_dir=data_dir,
        cache=cache,
        clock=clock,
    )


class ProviderHandle:
    """One configured provider: its registry entry, and its source, built once it can run.

    The handle closes a source it built; one given to it (tests, benches) is its maker's.
    """

    def __init__(
        self,
        name: str,
        config: ProviderConfig,
        build: Callable[[], OfferSource],
    ) -> None:
        self.name = name
        self.config = config
        self.entry: ProviderEntry = registry.get(name)
        self._build = build
        self._source: OfferSource | None = None
        self._owned = True
        self._lock = threading.Lock()
        # Called when the source says its offers changed (`offers_changed` below); the daemon
        # sets it to poll the provider again now.
        self.on_offers_changed: Callable[[bool], None] | None = None

    @classmethod
    def given(cls, name: str, config: ProviderConfig, source: OfferSource) -> ProviderHandle:
        """A handle around a source made elsewhere (tests, benches)."""
        handle = cls(name, config, lambda: source)
        handle._source = source
        handle._owned = False
        return handle

    @property
    def capabilities(self) -> Capabilities:
        return self.entry.capabilities

    def source(self) -> OfferSource:
        """The source; raises ProviderDisabled while the provider cannot run here."""
        with self._lock:
            if self._source is None:
                self._source = self._build()
            source = self._source
        notifier = self.entry.offers_notifier(source)
        if notifier is not None:
            # Its offers follow its own launches (owned machines: a launch takes GPUs, an
            # end frees them): it says when they changed, rather than leaving them stale
            # until the next poll.
            notifier.offers_changed = self._offers_changed
        return source

    def _offers_changed(self, freed: bool) -> None:
        if self.on_offers_changed is not None:
            self.on_offers_changed(freed)

    def launcher(self) -> Provider | None:
        """The source as a Provider (a Launcher) where the provider launches, else None;
        raises ProviderDisabled while it cannot run here."""
        if not self.capabilities.launch:
            return None
        return self.entry.launcher(self.source())

    @property
    def has_interruption_queue(self) -> bool:
        """The provider reads an interruption queue and this config names one."""
        return self.capabilities.interruption_queue and self.config.interruption_queue_configured

    def interruption_queue(self) -> InterruptionQueue | None:
        """The source as an InterruptionQueue where it has one configured, else None; raises
        ProviderDisabled while it cannot run here."""
        if not self.has_interruption_queue:
            return None
        return self.entry.interruption_queue(self.source())

    def start_hosted(self) -> None:
        """Start what the leading daemon hosts for this provider's running instances, if
        anything (the local cloud's metadata endpoint and ticker): a replica that takes over
        calls it. Raises ProviderDisabled while the provider cannot run here. A source given
        to the handle is its maker's, to start as to close."""
        if not self.capabilities.hosted or not self._owned:
            return
        hosted = self.entry.hosted(self.source())
        if hosted is not None:
            hosted.resume()

    def close(self) -> None:
        source = self._source
        if source is None or not self._owned:
            return
        launcher = self.entry.launcher(source)
        if launcher is None:
            return
        try:
            launcher.close()
        except Exception:
            log.exception("closing provider %s failed", self.name)


def make_handles(
    providers: dict[str, ProviderConfig], data_dir: Path, store: Store, clock: Clock
) -> dict[str, ProviderHandle]:
    """Handles for the enabled providers, in config order."""
    return {
        name: ProviderHandle(
            name,
            cfg,
            partial(
                registry.build,
                name,
                provider_settings(cfg, data_dir=data_dir, cache=store.prices, clock=clock),
            ),
        )
        for name, cfg in providers.items()
        if cfg.enabled
    }
