"""The daemon's offer sources, one per configured provider, built on first use.

`local` is the embedded local cloud (`providers.local.LocalCloud`, its state under
`<data dir>/local-cloud`); where that package cannot be imported, the bundled snapshot
stands in with its rows as they are. `aws` and `gcp` are the live adapters, with the store
as their spec cache; one that cannot run here (no credentials, no project) reports why as
ProviderDisabled on every poll, and is built as soon as it can run.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from optimizer.clock import Clock
from optimizer.daemon.config import ProviderConfig
from optimizer.store import Store
from providers.base import OfferSource, ProviderDisabled

log = logging.getLogger(__name__)

LOCAL_STATE_DIR = "local-cloud"
# Credentials providers read from the environment: kept out of error texts and logs.
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GPUOPT_GCP_BILLING_API_KEY")


def provider_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the credential variables that are set."""
    env = os.environ if environ is None else environ
    return [value for name in SECRET_ENV if (value := env.get(name, "").strip())]


def local_source(data_dir: Path, clock: Clock) -> OfferSource:
    """The local cloud, or the bundled snapshot where the local cloud is not installed."""
    try:
        from providers.local import LocalCloud
    except ImportError:
        from providers.snapshot import SnapshotSource

        log.info("providers.local is not available; the local provider serves the snapshot")
        return SnapshotSource()
    return LocalCloud(data_dir / LOCAL_STATE_DIR, clock=lambda: clock().timestamp())


def aws_source(config: ProviderConfig, store: Store | None, clock: Clock) -> OfferSource:
    from providers.aws import AwsProvider, aws_disabled_reason

    reason = aws_disabled_reason()
    if reason:
        raise ProviderDisabled(reason, provider="aws")
    return AwsProvider(
        config.regions or None,
        cache=store,
        clock=clock,
        placement_scores=config.placement_scores,
        queue_url=config.interruption_queue_url,
    )


def gcp_source(config: ProviderConfig, store: Store | None, clock: Clock) -> OfferSource:
    from providers.gcp import GcpSettings, make_gcp_provider

    settings = GcpSettings.from_env(project=config.project, regions=tuple(config.regions) or None)
    return make_gcp_provider(settings, cache=store, clock=clock)


class ProviderHandle:
    """One configured provider: its source, built once it can run."""

    def __init__(
        self,
        name: str,
        config: ProviderConfig,
        build: Callable[[], OfferSource],
    ) -> None:
        self.name = name
        self.config = config
        self._build = build
        self._source: OfferSource | None = None
        self._lock = threading.Lock()

    @classmethod
    def given(cls, name: str, config: ProviderConfig, source: OfferSource) -> ProviderHandle:
        """A handle around a source made elsewhere (tests, benches)."""
        handle = cls(name, config, lambda: source)
        handle._source = source
        return handle

    def source(self) -> OfferSource:
        """The source; raises ProviderDisabled while the provider cannot run here."""
        with self._lock:
            if self._source is None:
                self._source = self._build()
            return self._source

    @property
    def built(self) -> OfferSource | None:
        return self._source

    def close(self) -> None:
        source = self._source
        close = getattr(source, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("closing provider %s failed", self.name)


def make_handles(
    providers: dict[str, ProviderConfig], data_dir: Path, store: Store, clock: Clock
) -> dict[str, ProviderHandle]:
    """Handles for the enabled providers, in config order."""
    builders: dict[str, Callable[[ProviderConfig], OfferSource]] = {
        "local": lambda cfg: local_source(data_dir, clock),
        "aws": lambda cfg: aws_source(cfg, store, clock),
        "gcp": lambda cfg: gcp_source(cfg, store, clock),
    }
    return {
        name: ProviderHandle(name, cfg, partial(builders[name], cfg))
        for name, cfg in providers.items()
        if cfg.enabled
    }
