"""What a reconcile pass hands each reconciler: `ReconcileContext` and the `Reconciler` shape.

The daemon's reconcile loop (optimizer/daemon/loops/reconcile.py) builds one context per pass
and calls every reconciler with it. The context names what it needs from the daemon as small
protocols (a policy in force, a provider handle, an event drafter), so this package never
imports the daemon: the daemon's `LoadedPolicy`, `ProviderHandle` and `Emitter` fit them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.exc import InterfaceError, OperationalError

from optimizer.clock import Clock
from optimizer.model import EventKind
from optimizer.store import JobRecord, NewEvent, Store
from policies.schema import Policy
from providers.base import Provider

# The database out of reach: no one job's or policy's fault, so a reconciler lets it end the
# pass (the next pass tries again) instead of failing or skipping what it was handling.
UNREACHABLE = (OperationalError, InterfaceError)


class PolicyInForce(Protocol):
    """A loaded policy (the daemon's `LoadedPolicy`)."""

    @property
    def policy(self) -> Policy: ...


class ProviderHandle(Protocol):
    """One configured provider (the daemon's `ProviderHandle`)."""

    def launcher(self) -> Provider | None:
        """The provider to launch, describe and terminate through; None where the provider
        registry says it does not launch; raises ProviderError while it cannot run here."""
        ...


class EventDrafter(Protocol):
    """Builds events with their alert channels, for the caller to record (the `Emitter`)."""

    def draft(
        self,
        kind: EventKind,
        message: str,
        *,
        severity: str = "info",
        policy: str | None = None,
        job_id: int | None = None,
        data: Mapping[str, Any] | None = None,
        dedupe_key: str | None = None,
    ) -> NewEvent: ...


@dataclass(frozen=True, slots=True)
class ReconcileContext:
    """What one pass sees: the time, the live jobs, the policies in force, and the handles
    to act through (store, providers, emitter for events with alerts)."""

    now: datetime
    jobs: tuple[JobRecord, ...]
    policies: Mapping[str, PolicyInForce]
    store: Store
    providers: Mapping[str, ProviderHandle]
    emitter: EventDrafter
    clock: Clock
    # Whether this replica still leads; checked before acting on a cloud (a launch).
    leading: Callable[[], bool] = lambda: True


class Reconciler(Protocol):
    """One step of a pass; idempotent, and records what it changes in the store itself."""

    def __call__(self, ctx: ReconcileContext) -> None: ...


__all__ = [
    "UNREACHABLE",
    "EventDrafter",
    "PolicyInForce",
    "ProviderHandle",
    "ReconcileContext",
    "Reconciler",
]
