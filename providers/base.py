"""The provider contract: fetch offers, launch, describe, terminate; failures are typed.

Adapters translate each cloud's error codes into the classes below at the boundary, so
nothing above a provider ever parses an error message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from optimizer.model import Offer
from providers.config import ProviderConfig


class ProviderError(Exception):
    """A provider call failed for a reason none of the narrower classes covers.

    `code` is the cloud's own error code (`InsufficientInstanceCapacity`, `QUOTA_EXCEEDED`),
    `zone` the zone the failure is scoped to, where it is.
    """

    def __init__(
        self, message: str, *, provider: str = "", code: str = "", zone: str | None = None
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.code = code
        self.zone = zone


class CapacityError(ProviderError):
    """The cloud has no capacity for this type in this place right now."""


class QuotaError(ProviderError):
    """An account quota or limit stops the launch."""


class PriceTooLowError(ProviderError):
    """The spot cap is below the current spot price."""


class ThrottledError(ProviderError):
    """The API asked us to slow down."""


class AuthError(ProviderError):
    """Credentials are missing, wrong or lack a permission."""


class InstanceState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    TERMINATED = "terminated"


class EndReason(StrEnum):
    PREEMPTED = "preempted"
    USER = "user"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class InstanceRef:
    """Enough to find one launched instance again."""

    provider: str
    region: str
    zone: str | None
    instance_id: str


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """One instance as the provider describes it.

    `launched_at` is when the instance started, and `terminated_at` when it ended (once it
    has), as the cloud itself reports them: billing runs between the two (docs/costs.md,
    "Billing facts", says which field each adapter reads). Either is None when the cloud
    does not say.
    """

    ref: InstanceRef
    state: InstanceState
    end_reason: EndReason | None = None
    detail: str = ""  # the cloud's own words: state reason code, spot request status …
    launched_at: datetime | None = None
    terminated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What a provider needs to start one attempt's instance, cloud-neutral.

    `max_usd_per_hour` is set only when the policy asks to enforce its cap in the cloud
    (AWS MaxPrice); by default gpuopt enforces caps before launching, because a cloud-side
    cap adds price-triggered interruptions. `bootstrap` is the shell script the instance runs
    at first boot (user data / startup script): it installs and starts the gpuopt agent.
    """

    job: str
    attempt: int
    bootstrap: str
    image: str | None = None  # AMI id / GCE image; None = the provider's default GPU image
    disk_gib: int = 200
    max_usd_per_hour: float | None = None
    labels: tuple[tuple[str, str], ...] = ()  # extra tags/labels, besides job and attempt
    gang: Gang | None = None  # one node of a multi-node attempt: launch it in the gang's placement


@dataclass(frozen=True, slots=True)
class Gang:
    """One node's place in a multi-node attempt, launched together in one placement.

    `placement` names the gang's placement (an AWS cluster placement group, a GCP compact
    resource policy); the provider creates it with the first node and reuses it for the
    others (a retried node finds it made). `nodes` is the gang's size, `rank` this node's."""

    placement: str
    nodes: int
    rank: int


class SpecCache(Protocol):
    """Where a provider keeps slow-changing facts (instance specs) between polls.

    The store's prices repository (`store.prices`) implements it; providers never import the
    store.
    """

    def load_cached(self, provider: str, key: str) -> tuple[datetime, Any] | None:
        """(fetched_at, JSON value) saved under `key`, or None."""
        ...

    def save_cached(self, provider: str, key: str, value: Any, fetched_at: datetime) -> None: ...


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """What a provider is built from (its `build` in providers/registry.py): its part of the
    daemon config, or the CLI's defaults, plus what the daemon lends it.

    `config` is the provider's own config section, validated with the model its registry
    entry names (`ProviderEntry.settings`; the common keys only from the CLI). `data_dir` is
    the daemon's data directory (a provider keeps any state of its own in a folder there;
    None from the CLI), `cache` where slow-changing facts are kept between polls (None: in
    memory), `clock` the time offers are stamped with.
    """

    regions: tuple[str, ...] = ()  # empty: every region the provider knows
    config: ProviderConfig = field(default_factory=ProviderConfig)
    commitments: bool = False  # also fetch committed offers (1-/3-year commitment rates)
    data_dir: Path | None = None
    cache: SpecCache | None = None
    clock: Callable[[], datetime] = _utc_now


InterruptionKind = Literal["spot_interruption", "rebalance", "state_change"]


@dataclass(frozen=True, slots=True)
class InterruptionEvent:
    """One event about one instance from a provider's interruption queue.

    `detail` is the event's own word: the instance action (`terminate`, `stop`, `hibernate`)
    for a spot warning, the new state (`shutting-down`, `terminated` …) for a state change,
    empty for a rebalance recommendation. `at` is when the cloud sent it, which for a spot
    warning is about two minutes before the action.
    """

    instance_id: str
    kind: InterruptionKind
    at: datetime
    detail: str = ""
    region: str = ""


@runtime_checkable
class OfferSource(Protocol):
    """Anything that yields offers: a live cloud, a catalog file, the bundled snapshot."""

    name: str

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        """Prices, availability and specs, normalized; all known regions when None."""
        ...

    @property
    def problems(self) -> Sequence[str]:
        """What went wrong in the last fetch short of failing it, one line each (a region
        unreachable, specs served from an old copy); empty when nothing did."""
        ...


@runtime_checkable
class Launcher(Protocol):
    """Launch, describe and terminate: what a provider that declares `launch` implements
    (providers/registry.py)."""

    def launch(self, offer: Offer, spec: LaunchSpec, idempotency_key: str) -> InstanceRef:
        """Start an instance for `offer`; calling twice with one key yields one instance."""
        ...

    def describe(self, refs: Iterable[InstanceRef]) -> list[InstanceStatus]:
        """Current state of each instance and, once it ended, why."""
        ...

    def terminate(self, ref: InstanceRef) -> None: ...

    def close(self) -> None:
        """Release what the provider holds (clients, threads, servers); instances keep running."""
        ...


@runtime_checkable
class PlacementOwner(Protocol):
    """Deletes a gang's placement (`Gang.placement`: an AWS cluster placement group, a GCP
    compact resource policy), for providers that declare `gang_placement`
    (providers/registry.py). The reconciler asks once every node of the gang has ended."""

    def release_placement(self, region: str, placement: str) -> bool:
        """Delete the placement named `placement` in `region`: True once it is gone (deleted
        now, or already gone, so asking again is harmless), False while the cloud says an
        instance still uses it (ask again later); ProviderError for any other failure."""
        ...


@runtime_checkable
class OffersNotifier(Protocol):
    """A source whose offers follow its own launches, for providers that declare
    `offers_follow_launches` (providers/registry.py): owned machines offer the GPUs free now,
    so a launch takes some and an instance's end frees them. The daemon sets
    `offers_changed`, which the source calls after each such change (`freed`: capacity came
    back), to poll it again now rather than leave its offers stale until the next poll, and,
    when capacity came back, to end its pools' cooldowns (a launch that found no free GPU
    cooled its pool; a freed GPU makes it worth trying again at once)."""

    offers_changed: Callable[[bool], None]


@runtime_checkable
class HostedCloud(Protocol):
    """A cloud that runs inside the leading daemon, for providers that declare `hosted`
    (providers/registry.py): the local cloud's metadata endpoint and power-off ticker live in
    the daemon that launched its instances, and die with it."""

    def resume(self) -> None:
        """Serve the instances the cloud holds now (a takeover: what served them died with
        the leader that launched them); nothing while it holds none. Idempotent."""
        ...


@runtime_checkable
class Provider(OfferSource, Launcher, Protocol):
    """A cloud gpuopt can launch on: offers and instances."""


@runtime_checkable
class InterruptionQueue(Protocol):
    """An event queue of interruptions (AWS: EventBridge → SQS), for providers that declare
    `interruption_queue` (providers/registry.py)."""

    def poll_interruptions(
        self,
        *,
        wait_seconds: int,
        record: Callable[[list[InterruptionEvent]], None] | None = None,
    ) -> list[InterruptionEvent]:
        """Wait up to `wait_seconds` for events; hand each batch to `record` before it is
        acknowledged; the events read."""
        ...


class ProviderDisabled(ProviderError):
    """The provider cannot run here (no credentials, no SDK, no project); says why in one line."""
