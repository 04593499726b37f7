"""Recovery strategies: where a job goes next after an interruption, a failed probe, a lost
instance or a failed launch.

A strategy is pure: it answers from its settings, the job's recent failures and the time, and
does no I/O. The state machine (`machine.decide`) asks it where the next attempt goes after
an attempt failed (`after_failure`: pools to avoid and cool down, the markets to use, or
give up) and while a job waits for an offer (`while_pending`); the launch walk
(`launch.Launcher`) asks it what a capacity, quota or credentials error costs the pool or
the provider (`after_launch_error`).

A policy names its strategy in `recovery.strategy`; the other `recovery` keys are its
settings. The strategies are found through the `gpuopt.recovery_strategies` entry points
(each names a `Strategy` subclass whose `name` is the entry point's): gpuopt's own are declared
in its pyproject.toml, and another installed package adds one the same way (docs/extending.md,
"A recovery strategy"); the policy loader checks the name against the installed ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import ClassVar

from optimizer.common import plugins
from optimizer.lifecycle import Failure
from optimizer.model import Market, Pool
from policies.schema import Policy, RecoveryStrategy


class LaunchError(StrEnum):
    """The launch errors a strategy answers (others: retry, or the next offer)."""

    CAPACITY = "capacity"  # the pool has no capacity now
    QUOTA = "quota"  # the account's quota in the provider/region is used up
    AUTH = "auth"  # the provider refused our credentials


@dataclass(frozen=True, slots=True)
class RecoverySettings:
    """A strategy's settings: the policy's `recovery` keys as durations."""

    max_restarts: int = 20
    pool_cooldown: timedelta = timedelta(minutes=10)  # a pool that failed an attempt sits out
    on_demand_after_interruptions: int = 3  # this many within the window: on-demand (0: never)
    on_demand_window: timedelta = timedelta(hours=1)  # counts interruptions; the fallback lasts
    quota_cooldown: timedelta = timedelta(hours=1)  # a pool whose launch hit a quota sits out
    auth_cooldown: timedelta = timedelta(hours=1)  # a provider that refused our credentials
    on_demand_allowed: bool = True  # the policy's markets include on-demand

    @classmethod
    def of(cls, policy: Policy, *, max_restarts: int | None = None) -> RecoverySettings:
        """The settings a policy gives (a job spec's `max_restarts` wins over the policy's)."""
        r = policy.recovery
        return cls(
            max_restarts=r.max_restarts if max_restarts is None else max_restarts,
            pool_cooldown=timedelta(minutes=r.pool_cooldown_minutes),
            on_demand_after_interruptions=r.on_demand_after_interruptions,
            on_demand_window=timedelta(minutes=r.on_demand_window_minutes),
            quota_cooldown=timedelta(minutes=r.quota_cooldown_minutes),
            auth_cooldown=timedelta(minutes=r.auth_cooldown_minutes),
            on_demand_allowed="on_demand" in policy.markets,
        )


@dataclass(frozen=True, slots=True)
class Relaunch:
    """Where the next attempt goes."""

    avoid: frozenset[Pool] = frozenset()  # pools the next launch must not use
    cooldowns: tuple[tuple[Pool, datetime], ...] = ()  # pools that sit out until then
    markets: tuple[Market, ...] | None = None  # None: the policy's own markets
    note: str = ""  # added to the job's reason, e.g. "; … falling back to on-demand"


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No further attempt: the job fails."""

    reason: str  # added to the job's reason, e.g. "restart limit 20 reached"
    alert: str  # added to the alert, e.g. "gave up after 20 restarts"


@dataclass(frozen=True, slots=True)
class SitOut:
    """What a failed launch costs: the pool, or the whole provider, gets no launches until
    then (None: not at all). The walk skips a quota's provider/region, and a provider that
    refused our credentials, for the rest of that launch whatever the strategy says."""

    pool_until: datetime | None = None
    provider_until: datetime | None = None


# One failure as the history keeps it: what happened and when.
Past = tuple[Failure, datetime]


def _span(window: timedelta) -> str:
    """A duration in words: "an hour", "2 hours", "90 minutes"."""
    minutes = window.total_seconds() / 60
    if minutes == 60:
        return "an hour"
    return f"{minutes / 60:g} hours" if minutes % 60 == 0 else f"{minutes:g} minutes"


@dataclass(frozen=True, slots=True)
class Strategy(ABC):
    """The questions the state machine and the launch walk ask; `name` is what a policy's
    `recovery.strategy` says."""

    name: ClassVar[str]
    settings: RecoverySettings = RecoverySettings()

    @abstractmethod
    def after_failure(
        self,
        failure: Failure,
        pool: Pool,
        *,
        restarts: int,
        history: Sequence[Past],
        now: datetime,
    ) -> Relaunch | GiveUp:
        """Where the next attempt goes after one on `pool` ended with `failure`; `restarts`
        counts the relaunches so far, `history` the earlier failures (this one not included)."""

    @abstractmethod
    def while_pending(self, history: Sequence[Past], now: datetime) -> Relaunch:
        """Where a job without an attempt looks for one."""

    @abstractmethod
    def after_launch_error(self, error: LaunchError, now: datetime) -> SitOut:
        """What a failed launch costs its pool or provider."""


@dataclass(frozen=True, slots=True)
class Failover(Strategy):
    """The default: a failed attempt's pool sits out for `pool_cooldown` and the next launch
    avoids it; after `on_demand_after_interruptions` interruptions within `on_demand_window`
    the job runs on-demand only until the window has passed; the job fails after
    `max_restarts` relaunches. A pool without capacity sits out for `pool_cooldown` (the walk
    goes on to the next offer at once), a quota error cools the pool down for `quota_cooldown`
    and skips its provider/region for this launch, and a provider that refused our
    credentials sits out for `auth_cooldown`."""

    name: ClassVar[RecoveryStrategy] = RecoveryStrategy.FAILOVER

    def after_failure(
        self,
        failure: Failure,
        pool: Pool,
        *,
        restarts: int,
        history: Sequence[Past],
        now: datetime,
    ) -> Relaunch | GiveUp:
        s = self.settings
        if restarts + 1 > s.max_restarts:
            return GiveUp(
                f"restart limit {s.max_restarts} reached",
                f"gave up after {s.max_restarts} restarts",
            )
        markets, note = self._fallback([*history, (failure, now)], now)
        return Relaunch(
            avoid=frozenset({pool}),
            cooldowns=((pool, now + s.pool_cooldown),),
            markets=markets,
            note=note,
        )

    def while_pending(self, history: Sequence[Past], now: datetime) -> Relaunch:
        # A job still within an on-demand fallback must not drift back to spot because the
        # relaunch found no on-demand offer.
        markets, note = self._fallback(history, now)
        return Relaunch(markets=markets, note=note)

    def after_launch_error(self, error: LaunchError, now: datetime) -> SitOut:
        s = self.settings
        if error is LaunchError.CAPACITY:
            return SitOut(pool_until=now + s.pool_cooldown)
        if error is LaunchError.QUOTA:
            return SitOut(pool_until=now + s.quota_cooldown)
        return SitOut(provider_until=now + s.auth_cooldown)

    def counts(self, failure: Failure) -> bool:
        """Whether a failure counts toward the on-demand fallback: interruptions only."""
        return failure is Failure.PREEMPTED

    def threshold(self) -> int:
        """How many counted failures within the window move the job to on-demand (0: never)."""
        return self.settings.on_demand_after_interruptions

    def note(self, recent: int) -> str:
        """What the job's reason says when it falls back."""
        return (
            f"; {recent} interruptions within {_span(self.settings.on_demand_window)}: "
            "falling back to on-demand"
        )

    def _fallback(
        self, history: Sequence[Past], now: datetime
    ) -> tuple[tuple[Market, ...] | None, str]:
        s = self.settings
        window = s.on_demand_window
        recent = sum(1 for f, at in history if self.counts(f) and now - at <= window)
        needed = self.threshold()
        if not (s.on_demand_allowed and needed and recent >= needed):
            return None, ""
        return (Market.ON_DEMAND,), self.note(recent)


@dataclass(frozen=True, slots=True)
class EagerOnDemand(Failover):
    """`eager-on-demand`: like `failover`, but any failed attempt (an interruption, a failed
    probe, a lost instance, an agent that never checked in) moves the job to on-demand at
    once, for `on_demand_window`; `on_demand_after_interruptions` is not used. For work that
    should not hunt for spot capacity once spot has let it down."""

    name: ClassVar[RecoveryStrategy] = RecoveryStrategy.EAGER_ON_DEMAND

    def counts(self, failure: Failure) -> bool:
        return True

    def threshold(self) -> int:
        return 1

    def note(self, recent: int) -> str:
        failed = "a failed attempt" if recent == 1 else f"{recent} failed attempts"
        window = _span(self.settings.on_demand_window)
        return f"; {failed} within {window}: on-demand at once (eager-on-demand)"


@dataclass(frozen=True, slots=True)
class WithDeadline(Strategy):
    """A job with a deadline: its strategy's answers, but the markets of every relaunch and of
    every launch while it waits are the deadline strategy's (optimizer/jobs/deadlines.py),
    decided at this pass from the job's slack. The pools to avoid and cool down, the restart
    limit and what a failed launch costs stay the job's strategy's."""

    name: ClassVar[str] = "deadline"
    inner: Strategy = Failover()
    markets: tuple[Market, ...] | None = None  # None: the policy's own
    why: str = ""  # the deadline strategy's reason, for the job's reason

    def _note(self) -> str:
        return f"; deadline: {self.why}" if self.why else ""

    def after_failure(
        self,
        failure: Failure,
        pool: Pool,
        *,
        restarts: int,
        history: Sequence[Past],
        now: datetime,
    ) -> Relaunch | GiveUp:
        where = self.inner.after_failure(failure, pool, restarts=restarts, history=history, now=now)
        if isinstance(where, GiveUp):
            return where
        return self._ours(where)

    def while_pending(self, history: Sequence[Past], now: datetime) -> Relaunch:
        return self._ours(self.inner.while_pending(history, now))

    def _ours(self, where: Relaunch) -> Relaunch:
        if self.markets is None:  # the policy does not allow the market the deadline wants
            return where
        return Relaunch(where.avoid, where.cooldowns, self.markets, self._note())

    def after_launch_error(self, error: LaunchError, now: datetime) -> SitOut:
        return self.inner.after_launch_error(error, now)


def with_deadline(
    strategy: Strategy, markets: tuple[Market, ...] | None, why: str = ""
) -> Strategy:
    """The recovery seam for a job with a deadline: `strategy`, its relaunches on `markets`
    (the deadline strategy's choice at this pass; None: the policy's own markets)."""
    return WithDeadline(strategy.settings, strategy, markets, why)


DEFAULT = Failover.name


def _check(kind: type, name: str) -> None:
    if not issubclass(kind, Strategy) or getattr(kind, "name", None) != name:
        raise plugins.PluginError(
            f"entry point {plugins.RECOVERY_STRATEGIES} {name}: not a Strategy named {name!r}"
        )


_TABLE: plugins.Table[type] = plugins.Table(
    plugins.RECOVERY_STRATEGIES, type, _check, what="recovery strategy", error=ValueError
)
reload = _TABLE.reload


def strategies() -> Mapping[str, type[Strategy]]:
    """The strategies by name, the installed ones read from their entry points once."""
    return _TABLE.all()


@contextmanager
def registered(kind: type[Strategy]) -> Iterator[type[Strategy]]:
    """A strategy registered in this process for the length of a `with` block (tests; an
    installed package declares an entry point instead); policies may name it meanwhile."""
    with _TABLE.registered(kind.name, kind):
        yield kind


def strategy_for(policy: Policy, *, max_restarts: int | None = None) -> Strategy:
    """The strategy a policy names, with the policy's settings; a name no installed strategy
    has (the policy was loaded where another package was installed) is a PluginError naming
    the installed ones."""
    kind = strategies().get(policy.recovery.strategy)
    if kind is None:
        known = ", ".join(strategies())
        raise plugins.PluginError(
            f"unknown recovery strategy {policy.recovery.strategy!r}; installed: {known}"
        )
    return kind(RecoverySettings.of(policy, max_restarts=max_restarts))


__all__ = [
    "DEFAULT",
    "EagerOnDemand",
    "Failover",
    "Failure",
    "GiveUp",
    "LaunchError",
    "Past",
    "RecoverySettings",
    "Relaunch",
    "SitOut",
    "Strategy",
    "WithDeadline",
    "registered",
    "strategies",
    "strategy_for",
    "with_deadline",
]
