"""Moving running jobs to better capacity: the pure pass that decides which jobs move.

`plan(jobs, markets, now)` looks at every running job of a policy whose `migration.enabled`
is set, against what its policy allows now (`PolicyMarket`: the allowed offers in rank
order, the rule that rejects each running job's own pool, recent prices, cooldowns), and
returns the moves to make, each with the reason and the arithmetic that justifies it, and the
moves it held back (and why). It does no I/O and reads no clock but `now`; the reconciler
gathers its inputs (migration_inputs.py) and makes each move through the interruption path:
the new attempt launches while the old one keeps running, the old job gets SIGTERM to
checkpoint once the new instance is ready, and the new job starts only after the old one has
exited (handover.handover and handover.fence).

A job moves when (in this order of precedence):

1. its pool's price is above the policy's bid cap (`Reason.BID_CAP`), or the policy in force
   no longer allows its pool at all (`Reason.NOT_ALLOWED`: a schedule window changed the
   markets, bid or placement, or the file was edited) — to the best offer allowed now;
2. it runs on-demand, and an allowed spot offer (the policy in force lists spot, and the
   job's recovery strategy has no on-demand fallback in force) that ranks above its own has
   been available — listed, out of cooldown — for `return_to_spot_after`
   (`Reason.RETURN_TO_SPOT`);
3. an allowed offer ranking above its own has cost at most `1 - min_savings` of the job's
   price for all of the last `min_stable` (of the lowest price the job's own pool had in that
   time: the gap must have held all along), and the saving over the job's expected remaining
   time is more than the restart overhead costs (`Reason.CHEAPER`; for an on-demand job,
   spot offers count only by rule 2).

Guards, for every reason: a job moves only once its attempt has run `min_runtime` (from its
launch, on the daemon's clock), at
most `max_per_day` times in any 24 hours, and at most `disruption_budget` jobs of one policy
move at once (those already moving count): moves forced by the policy go first, then returns
to spot, then the largest expected savings.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from optimizer.model import Pool
from policies import rulebook
from policies.price_rules import BUDGET, STALE
from policies.schema import Policy

DAY = timedelta(days=1)
MAX_TARGETS = 25  # pools a move's launch may try, in rank order (launch.MAX_OFFERS_TRIED)
NOT_A_TRIGGER = frozenset(
    {STALE.id, BUDGET.id}
)  # rules whose rejection of a job's pool moves nothing


class Reason(StrEnum):
    """Why a job moves (the `job.migrated` event's `reason`)."""

    BID_CAP = "bid_cap"
    NOT_ALLOWED = "not_allowed"
    RETURN_TO_SPOT = "return_to_spot"
    CHEAPER = "cheaper"
    DEADLINE = "deadline"  # the job's deadline strategy wants the other market (deadlines.py)


_PRECEDENCE = {
    Reason.BID_CAP: 0,
    Reason.NOT_ALLOWED: 0,
    Reason.RETURN_TO_SPOT: 1,
    Reason.CHEAPER: 2,
    Reason.DEADLINE: 0,
}


@dataclass(frozen=True, slots=True)
class MigrationSettings:
    """A policy's `migration` block, as durations."""

    enabled: bool = False
    min_savings: float = 0.25
    min_stable: timedelta = timedelta(minutes=30)
    return_to_spot_after: timedelta = timedelta(minutes=30)
    max_per_day: int = 4
    min_runtime: timedelta = timedelta(minutes=10)
    disruption_budget: int = 1

    @classmethod
    def of(cls, policy: Policy) -> MigrationSettings:
        m = policy.migration
        return cls(
            enabled=m.enabled,
            min_savings=m.min_savings,
            min_stable=timedelta(seconds=m.min_stable),
            return_to_spot_after=timedelta(seconds=m.return_to_spot_after),
            max_per_day=m.max_per_day,
            min_runtime=timedelta(seconds=m.min_runtime),
            disruption_budget=m.disruption_budget,
        )

    @property
    def lookback(self) -> timedelta:
        """How much price history the pass reads."""
        return max(self.min_stable, self.return_to_spot_after)


@dataclass(frozen=True, slots=True)
class Option:
    """An offer the policy allows now: a pool a job may move to."""

    pool: Pool
    usd_per_hour: float

    @property
    def market(self) -> str:
        return self.pool[4]


# A pool's prices in effect, (at, usd) oldest first: the first point is the one in effect at
# the start of the window read (store.prices.price_histories with `prior`).
History = Sequence[tuple[datetime, float]]


@dataclass(frozen=True, slots=True)
class PolicyMarket:
    """One policy's side of the pass: its settings, the offers it allows now in rank order
    (pools in cooldown included: `cooldowns` says until when), the rule that rejects each
    running job's own pool now (pools it allows are absent), the price history of the pools,
    and how many of its jobs are moving now."""

    name: str
    settings: MigrationSettings
    options: Sequence[Option]
    refused: Mapping[Pool, str]
    history: Mapping[Pool, History]
    cooldowns: Mapping[Pool, datetime]  # each pool's latest cooldown end (past or future)
    moving: int = 0
    window: str | None = None  # the schedule window in force, for the messages


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job running on its attempt, healthy, with nothing in hand over."""

    id: int
    name: str
    policy: str
    pool: Pool  # its attempt's pool as the offers key it (a regional on-demand pool: zone None)
    usd_per_hour: float  # its pool's price now (its launch price when no longer listed)
    running_since: datetime  # when its attempt launched (the daemon's clock)
    remaining: timedelta  # how much longer it is expected to run
    remaining_note: str  # where that comes from, for the event
    overhead: timedelta  # what one restart costs it in time
    overhead_note: str
    moved_at: tuple[datetime, ...] = ()  # its earlier migrations
    spot_allowed: bool = True  # its recovery strategy leaves it spot now (no fallback window)


@dataclass(frozen=True, slots=True)
class Move:
    """One job to move: the pools to try, in rank order, and why."""

    job_id: int
    job: str
    policy: str
    reason: Reason
    targets: tuple[Pool, ...]
    from_usd: float
    to_usd: float  # the first target's price
    expected_saving_usd: float  # over the expected remaining time
    overhead_usd: float
    message: str  # the reason in words, with the arithmetic

    @property
    def saving_usd_per_hour(self) -> float:
        return self.from_usd - self.to_usd


@dataclass(frozen=True, slots=True)
class Held:
    """A move a job qualified for but did not get, and why."""

    job_id: int
    reason: Reason
    why: str


@dataclass(frozen=True, slots=True)
class Plan:
    moves: tuple[Move, ...] = ()
    held: tuple[Held, ...] = ()


def _usd(value: float) -> str:
    return f"${value:,.4f}/h"


def _hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600


def _span(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def describe(pool: Pool) -> str:
    provider, region, zone, kind, market = pool
    return f"{provider} {zone or region} {kind} {market}"


def highest_since(history: History, since: datetime) -> float | None:
    """The highest price in effect over [since, …) — None when the history does not reach
    back to `since` (a pool seen for less long cannot have been cheap all that time)."""
    if not history or history[0][0] > since:
        return None
    times = [at for at, _ in history]
    first = max(bisect_right(times, since) - 1, 0)  # the point in effect at `since`
    return max(usd for _, usd in history[first:])


def lowest_since(history: History, since: datetime) -> float | None:
    """The lowest price in effect over [since, …) (None: no history at all); a history that
    starts after `since` gives the lowest it has."""
    if not history:
        return None
    times = [at for at, _ in history]
    first = max(bisect_right(times, since) - 1, 0)
    return min(usd for _, usd in history[first:])


def available_since(market: PolicyMarket, pool: Pool, now: datetime) -> datetime | None:
    """Since when the pool has been listed and out of cooldown (None: it is cooling down, or
    no history)."""
    history = market.history.get(pool)
    if not history:
        return None
    since = history[0][0]
    cooled = market.cooldowns.get(pool)
    if cooled is not None:
        if cooled > now:
            return None
        since = max(since, cooled)
    return since


@dataclass(frozen=True, slots=True)
class _Want:
    job: RunningJob
    reason: Reason
    targets: tuple[Option, ...]
    expected_saving_usd: float
    overhead_usd: float
    message: str


def _targets(
    market: PolicyMarket,
    job: RunningJob,
    now: datetime,
    ok: Callable[[Option], bool],
    *,
    rank_above: bool,
) -> tuple[Option, ...]:
    """The allowed pools, in rank order, that `ok` accepts for the job (with `rank_above`,
    only those ranked above the job's own pool), less its own and those cooling down."""
    out: list[Option] = []
    for option in market.options:
        if rank_above and option.pool == job.pool:
            break  # only offers that rank above the job's own
        if option.pool == job.pool or (option.market == "spot" and not job.spot_allowed):
            continue
        cooled = market.cooldowns.get(option.pool)
        if cooled is not None and cooled > now:
            continue
        if ok(option):
            out.append(option)
            if len(out) == MAX_TARGETS:
                break
    return tuple(out)


def _economics(job: RunningJob, to_usd: float) -> tuple[float, float, str]:
    """(expected saving, overhead cost, the arithmetic in words) of moving `job` to `to_usd`."""
    saving = (job.usd_per_hour - to_usd) * _hours(job.remaining)
    overhead = _hours(job.overhead) * to_usd
    words = (
        f"saves ({_usd(job.usd_per_hour)} - {_usd(to_usd)}) x {_hours(job.remaining):.2f} h "
        f"remaining ({job.remaining_note}) = ${saving:,.2f} > restart overhead "
        f"{_hours(job.overhead):.3f} h x {_usd(to_usd)} = ${overhead:,.2f} ({job.overhead_note})"
    )
    return saving, overhead, words


@dataclass
class _Memo:
    """What one policy's jobs share within a pass: each pool's highest and lowest price over
    `min_stable`, and the targets found for jobs on the same pool at the same price."""

    highest: dict[Pool, float | None]
    lowest: dict[Pool, float | None]
    targets: dict[tuple[str, Pool, float, bool], tuple[Option, ...]]


def _want(job: RunningJob, market: PolicyMarket, now: datetime, memo: _Memo) -> _Want | None:
    """The move the job qualifies for, before the guards (None: none)."""
    s = market.settings
    where = f"{describe(job.pool)} at {_usd(job.usd_per_hour)}"
    rule = market.refused.get(job.pool)
    if rule is not None and rule not in NOT_A_TRIGGER:
        key = ("forced", job.pool, job.usd_per_hour, job.spot_allowed)
        if key not in memo.targets:
            memo.targets[key] = _targets(market, job, now, lambda o: True, rank_above=False)
        targets = memo.targets[key]
        if any(rule == cap.id for cap in rulebook.bid_caps()):
            reason = Reason.BID_CAP
            why = f"{where} is above the policy's bid cap ({rule})"
        else:
            reason = Reason.NOT_ALLOWED
            during = f" during window {market.window}" if market.window else ""
            why = f"the policy in force{during} no longer allows {where} ({rule})"
        if not targets:
            return _Want(job, reason, (), 0.0, 0.0, f"{why}; no allowed offer to move to")
        saving, overhead, _ = _economics(job, targets[0].usd_per_hour)
        to = targets[0]
        return _Want(
            job,
            reason,
            targets,
            saving,
            overhead,
            f"{why}; moving to {describe(to.pool)} at {_usd(to.usd_per_hour)}",
        )

    if job.pool[4] == "on_demand" and job.spot_allowed:
        since = now - s.return_to_spot_after

        def settled(o: Option) -> bool:
            began = available_since(market, o.pool, now)
            return (
                o.market == "spot"
                and o.usd_per_hour < job.usd_per_hour
                and began is not None
                and began <= since
            )

        key = ("spot", job.pool, job.usd_per_hour, job.spot_allowed)
        if key not in memo.targets:
            memo.targets[key] = _targets(market, job, now, settled, rank_above=True)
        targets = memo.targets[key]
        if targets:
            to = targets[0]
            saving, overhead, words = _economics(job, to.usd_per_hour)
            return _Want(
                job,
                Reason.RETURN_TO_SPOT,
                targets,
                saving,
                overhead,
                f"on-demand {where}; spot {describe(to.pool)} at {_usd(to.usd_per_hour)} has "
                f"been available for at least {_span(s.return_to_spot_after)}; {words}",
            )

    stable_since = now - s.min_stable
    # The gap must have held all along: against the lowest the job's own pool cost over the
    # window (a spike of its own price alone moves nothing until it has lasted).
    if job.pool not in memo.lowest:
        memo.lowest[job.pool] = lowest_since(market.history.get(job.pool, ()), stable_since)
    own = memo.lowest[job.pool]
    ceiling = (1 - s.min_savings) * (
        job.usd_per_hour if own is None else min(own, job.usd_per_hour)
    )

    def cheap(o: Option) -> bool:
        # An on-demand job goes back to spot by the rule above, which asks for the capacity
        # to have been there (out of cooldown), not only for the price.
        if o.usd_per_hour > ceiling or (job.pool[4] == "on_demand" and o.market == "spot"):
            return False
        if o.pool not in memo.highest:
            memo.highest[o.pool] = highest_since(market.history.get(o.pool, ()), stable_since)
        top = memo.highest[o.pool]
        return top is not None and top <= ceiling

    key = ("cheaper", job.pool, job.usd_per_hour, job.spot_allowed)
    if key not in memo.targets:
        memo.targets[key] = _targets(market, job, now, cheap, rank_above=True)
    targets = memo.targets[key]
    if not targets:
        return None
    to = targets[0]
    saving, overhead, words = _economics(job, to.usd_per_hour)
    if saving <= overhead:
        return None
    cut = 1 - to.usd_per_hour / job.usd_per_hour
    return _Want(
        job,
        Reason.CHEAPER,
        targets,
        saving,
        overhead,
        f"{describe(to.pool)} at {_usd(to.usd_per_hour)} is {cut:.0%} cheaper than {where} "
        f"(at least {s.min_savings:.0%} for {_span(s.min_stable)}); {words}",
    )


def _guard(want: _Want, s: MigrationSettings, now: datetime) -> str | None:
    """Why a wanted move may not happen now (None: it may)."""
    job = want.job
    if not want.targets:
        return want.message
    ran = now - job.running_since
    if ran < s.min_runtime:
        return f"its attempt has run {_span(ran)}, less than min_runtime {_span(s.min_runtime)}"
    recent = sum(1 for at in job.moved_at if now - at < DAY)
    if recent >= s.max_per_day:
        return f"it moved {recent} time(s) in the last 24 h (max_per_day {s.max_per_day})"
    return None


def plan(jobs: Sequence[RunningJob], markets: Mapping[str, PolicyMarket], now: datetime) -> Plan:
    """The moves to make now, and those held back (module docstring)."""
    wanted: dict[str, list[_Want]] = {}
    held: list[Held] = []
    memos: dict[str, _Memo] = {}
    for job in jobs:
        market = markets.get(job.policy)
        if market is None or not market.settings.enabled:
            continue
        memo = memos.setdefault(job.policy, _Memo({}, {}, {}))
        want = _want(job, market, now, memo)
        if want is None:
            continue
        why = _guard(want, market.settings, now)
        if why is not None:
            held.append(Held(job.id, want.reason, why))
            continue
        wanted.setdefault(job.policy, []).append(want)
    moves: list[Move] = []
    for name in sorted(wanted):
        market = markets[name]
        room = market.settings.disruption_budget - market.moving
        ordered = sorted(
            wanted[name],
            key=lambda w: (
                _PRECEDENCE[w.reason],
                -(w.expected_saving_usd - w.overhead_usd),
                w.job.id,
            ),
        )
        for want in ordered:
            if room <= 0:
                held.append(
                    Held(
                        want.job.id,
                        want.reason,
                        f"policy {name}'s disruption budget of {market.settings.disruption_budget} "
                        "job(s) moving at once is used",
                    )
                )
                continue
            room -= 1
            job = want.job
            moves.append(
                Move(
                    job_id=job.id,
                    job=job.name,
                    policy=name,
                    reason=want.reason,
                    targets=tuple(o.pool for o in want.targets),
                    from_usd=job.usd_per_hour,
                    to_usd=want.targets[0].usd_per_hour,
                    expected_saving_usd=want.expected_saving_usd,
                    overhead_usd=want.overhead_usd,
                    message=want.message,
                )
            )
    return Plan(tuple(moves), tuple(held))


__all__ = [
    "MAX_TARGETS",
    "Held",
    "History",
    "MigrationSettings",
    "Move",
    "Option",
    "Plan",
    "PolicyMarket",
    "Reason",
    "RunningJob",
    "available_since",
    "highest_since",
    "lowest_since",
    "plan",
]
