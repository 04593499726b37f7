"""What a reconcile pass hands each reconciler: `ReconcileContext` and the `Reconciler` shape.

The daemon's reconcile loop (optimizer/daemon/loops/reconcile.py) builds one context per pass
and calls every reconciler with it. The context names what it needs from the daemon as small
protocols (a policy in force, a provider handle, an event drafter), so this package never
imports the daemon: the daemon's `LoadedPolicy`, `ProviderHandle` and `Emitter` fit them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar, cast

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


T = TypeVar("T")


class PassMemo:
    """Inputs read once per pass and shared by everything the pass runs: what does not change
    within a pass (the latest offers, the probe figures; see ranking.pass_table and
    ranking.pass_measured). Never what a pass itself changes (cooled pools, a policy's
    committed spend): those are read fresh where they are needed."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[Hashable, object] = {}

    def get(self, key: Hashable, read: Callable[[], T]) -> T:
        """The value under `key`, read with `read` the first time it is asked for."""
        if key not in self._values:
            self._values[key] = read()
        return cast(T, self._values[key])


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
    # What the pass reads once and shares (`PassMemo`): a context is built once per pass.
    memo: PassMemo = field(default_factory=PassMemo, compare=False, repr=False)
    # Ask for a pass at an instant (the daemon's alarm): a decision due at a known time, such
    # as the checkpoint window's stop, is taken then rather than at the next tick.
    wake_at: Callable[[datetime], None] = lambda _at: None


class Reconciler(Protocol):
    """One step of a pass; idempotent, and records what it changes in the store itself."""

    def __call__(self, ctx: ReconcileContext) -> None: ...


__all__ = [
    "UNREACHABLE",
    "EventDrafter",
    "PassMemo",
    "PolicyInForce",
    "ProviderHandle",
    "ReconcileContext",
    "Reconciler",
]
