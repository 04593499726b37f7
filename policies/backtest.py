"""Replaying a policy over a price history (docs/backtest.md has the semantics in words).

Pure and columnar: the history is three point columns (pool, time, price) and one row of
hardware per pool. Prices go into a snapshots x pools matrix, filled forward (a pool's price
at a snapshot is its latest observation at or before it); the shape rules run once per pool
(`policies.columnar.shapes`), and stale, the bid caps and the budget run over the whole matrix
at once, each by its rule's own mask (`policies.rulebook`), the one the engine applies. Only
the job's walk from snapshot to snapshot is a Python loop, one step per snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any, Protocol

import numpy as np

from optimizer.clock import utc_text
from optimizer.model import Market, Offer
from policies import budget, schedule
from policies.columnar import PASSED, shapes
from policies.price_rules import STALE
from policies.rule import BidCap, Prices
from policies.rules import RuleSet
from policies.schema import Policy
from policies.table import OfferTable

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Subtracted from an owned offer's score where the policy owns first: below any price.
OWNED_FIRST = 1e12


class BacktestError(ValueError):
    """A history or a window that cannot be replayed (no snapshot in it, say)."""


def seconds(value: datetime) -> int:
    """Whole seconds since the epoch, UTC."""
    return int((value - EPOCH) // timedelta(seconds=1))


def instant(value: int) -> datetime:
    return EPOCH + timedelta(seconds=int(value))


@dataclass(frozen=True, slots=True)
class History:
    """Price points: `pool[i]` (a row of `pools`) cost `usd_per_hour[i]` from `at[i]` (epoch
    seconds). `pools` holds one Offer per pool for its hardware (its own price is unused)."""

    pools: OfferTable
    pool: np.ndarray  # int64 per point
    at: np.ndarray  # int64 seconds per point
    usd_per_hour: np.ndarray  # float64 per point

    @classmethod
    def from_offers(cls, offers: Iterable[Offer]) -> History:
        """Each offer one point; offers of one pool (Offer.pool) share its first's hardware."""
        index: dict[Any, int] = {}
        first: list[Offer] = []
        pool: list[int] = []
        at: list[int] = []
        price: list[float] = []
        for offer in offers:
            key = offer.pool
            found = index.get(key)
            if found is None:
                found = index[key] = len(first)
                first.append(offer)
            pool.append(found)
            at.append(seconds(offer.observed_at))
            price.append(offer.usd_per_hour)
        return cls(
            OfferTable.from_offers(first),
            np.array(pool, dtype=np.int64),
            np.array(at, dtype=np.int64),
            np.array(price, dtype=np.float64),
        )


class Mover(Protocol):
    """Whether a job on a pool that is still a candidate moves anyway, and where to."""

    def __call__(
        self, found: Market_, snapshot: int, pool: int, placed: int, first_start: int
    ) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Step:
    """One snapshot of the replay: where the job ran until the next one, and at what price."""

    at: datetime
    pool: Offer | None  # None: no candidate
    usd_per_hour: float | None
    on_demand_usd_per_hour: float | None  # the baseline's price for the same shape
    hours: float  # until the next snapshot (or --until)
    cost_usd: float  # cumulative, through this interval


@dataclass(frozen=True, slots=True)
class Backtest:
    """What replaying one policy over a history cost (docs/backtest.md)."""

    policy: str
    start: datetime
    end: datetime
    snapshots: int
    pools: int
    cost_usd: float
    on_demand_usd: float
    hours: float
    hours_without_candidate: float
    hours_without_baseline: float  # running on a pool with no on-demand price to compare
    moves: int
    cap_crossings: int
    steps: Sequence[Step] = field(repr=False)
    migrations: int = 0  # moves the policy's migration block made (counted in moves too)

    @property
    def savings_usd(self) -> float:
        return self.on_demand_usd - self.cost_usd

    def to_dict(self, *, series: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.policy,
            "start": _text(self.start),
            "end": _text(self.end),
            "snapshots": self.snapshots,
            "pools": self.pools,
            "cost_usd": round(self.cost_usd, 2),
            "on_demand_usd": round(self.on_demand_usd, 2),
            "savings_usd": round(self.savings_usd, 2),
            "hours": round(self.hours, 4),
            "hours_without_candidate": round(self.hours_without_candidate, 4),
            "hours_without_baseline": round(self.hours_without_baseline, 4),
            "moves": self.moves,
            "cap_crossings": self.cap_crossings,
            "migrations": self.migrations,
        }
        if series:
            out["series"] = [
                {
                    "at": _text(s.at),
                    "pool": None if s.pool is None else pool_name(s.pool),
                    "usd_per_hour": s.usd_per_hour,
                    "on_demand_usd_per_hour": s.on_demand_usd_per_hour,
                    "hours": s.hours,
                    "cost_usd": round(s.cost_usd, 6),
                }
                for s in self.steps
            ]
        return out


def _text(value: datetime) -> str:
    return utc_text(value)


def pool_name(offer: Offer) -> str:
    """provider/region/zone/type/market, as the CLI prints a pool."""
    zone = offer.zone or "-"
    return f"{offer.provider}/{offer.region}/{zone}/{offer.instance_type}/{offer.market.value}"


@dataclass(frozen=True, slots=True)
class Market_:
    """The replay's matrices, snapshots x pools, before the walk (also what advise-bid reads)."""

    times: np.ndarray  # int64 seconds per snapshot
    price: np.ndarray  # USD/h, NaN where the pool has no observation yet (or it is stale)
    allowed: np.ndarray  # bool: passes every rule but the bid caps and the budget
    capped: np.ndarray  # bool: allowed, and fails a bid cap
    candidate: np.ndarray  # bool: passes every rule
    score: np.ndarray  # what rank_by orders on; inf where not a candidate
    on_demand: np.ndarray  # the baseline price; NaN where none
    best: np.ndarray  # per snapshot: the best candidate's pool row, -1 where none
    cheapest_allowed: np.ndarray  # per snapshot: the lowest price any cap would have to allow
    share_allowed: np.ndarray  # per snapshot: likewise, as a share of on-demand


def snapshots(history: History, since: datetime | None, until: datetime | None) -> np.ndarray:
    """The replay's snapshot times: distinct observation times within [since, until]."""
    return _window(np.unique(history.at), since, until)


def _window(times: np.ndarray, since: datetime | None, until: datetime | None) -> np.ndarray:
    keep = np.ones(len(times), dtype=bool)
    if since is not None:
        keep &= times >= seconds(since)
    if until is not None:
        keep &= times <= seconds(until)
    return times[keep]  # type: ignore[no-any-return]


def market(
    policy: Policy,
    history: History,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    bid: dict[str, float] | None = None,
    advice: bool = False,
) -> Market_:
    """The matrices a replay walks (module docstring), each snapshot under the policy in
    force then (its schedule's window); `bid` replaces the bid block of every policy in force
    (what advise-bid replays)."""
    at = history.at
    if bool(np.all(at[1:] >= at[:-1])):  # written in time order, as exports and polls are
        order = None
        change = np.empty(len(at), dtype=bool)
        change[:1] = True
        np.not_equal(at[1:], at[:-1], out=change[1:])
        every = at[change]
        rows = np.cumsum(change) - 1
    else:
        order = np.argsort(at, kind="stable")
        every = np.unique(at)
        rows = np.searchsorted(every, at[order])
    times = _window(every, since, until)
    if len(times) == 0:
        raise BacktestError("the history has no observation in the window")
    filled = np.full((len(every), len(history.pools)), -1, dtype=np.int64)
    # Each point's index in the point arrays, at its (time, pool) cell; a later row of the
    # same pool and time wins. Filling forward then gives each cell its latest point.
    # Positions in time order, so that the largest is the latest; mapped back to rows below.
    filled[rows, history.pool if order is None else history.pool[order]] = np.arange(len(at))
    del rows
    np.maximum.accumulate(filled, axis=0, out=filled)
    picked = filled[np.searchsorted(every, times)]
    del filled
    if order is not None:
        picked = np.where(picked >= 0, order[picked], -1)
    exists = picked >= 0
    price = np.where(exists, history.usd_per_hour[picked], np.nan)
    observed = None  # only the stale rule reads when each price was observed
    if policy.max_price_age_hours is not None:
        observed = np.where(exists, history.at[picked], np.iinfo(np.int64).min)
    del picked
    parts = [
        _judge(
            _in_force(policy, instant(times[start]), bid),
            history,
            times[start:stop],
            price[start:stop],
            None if observed is None else observed[start:stop],
            advice,
        )
        for start, stop in _segments(policy, times)
    ]
    if len(parts) == 1:
        return parts[0]
    return Market_(*(np.concatenate([getattr(p, f) for p in parts]) for f in Market_.__slots__))


def _in_force(policy: Policy, when: datetime, bid: dict[str, float] | None) -> Policy:
    plain = schedule.effective(policy, when)
    if bid is not None:
        plain = plain.model_copy(update={"bid": plain.bid.model_validate(bid)})
    return plain


def _segments(policy: Policy, times: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) snapshot ranges under one schedule window each."""
    edges = [0]
    if policy.schedule is not None and len(times) > 1:
        moments = schedule.transitions(policy.schedule, instant(times[0]), instant(times[-1]))
        at = np.array([seconds(t.at) for t in moments], dtype=np.int64)
        edges += [int(i) for i in np.searchsorted(times, at, side="left") if 0 < i < len(times)]
    return list(pairwise([*sorted(set(edges)), len(times)]))


def _judge(
    policy: Policy,
    history: History,
    times: np.ndarray,
    price: np.ndarray,
    observed: np.ndarray | None,
    advice: bool,
) -> Market_:
    """The rules of one plain policy over snapshots x pools (the engine's formulas); with
    `advice`, also what each snapshot needs of a bid cap."""
    rules = RuleSet(policy, instant(times[0]))
    found = shapes(rules, history.pools)
    shape_ok = found.rule[found.ids] == PASSED
    fresh = ~np.isnan(price)
    if policy.max_price_age_hours is not None and observed is not None:
        fresh &= STALE.fresh(policy.max_price_age_hours, observed, times)
    price = np.where(fresh, price, np.nan)
    allowed = fresh & shape_ok[None, :]

    pools = history.pools
    market_codes = pools.column("market")
    on_demand_pool = market_codes.codes == market_codes.code_of(Market.ON_DEMAND)
    spot_pool = market_codes.codes == market_codes.code_of(Market.SPOT)
    groups, _ = pools.group(("provider", "region", "instance_type"))
    reference = _references(price, on_demand_pool, groups)

    def hours_left() -> np.ndarray:
        # Nothing spent: see docs/backtest.md; a gang launches `nodes` instances.
        left = [budget.hours_left(instant(t), rules.hours_per_month) for t in times.tolist()]
        return np.array(left)[:, None]

    prices = Prices(price, pools.number("gpu_count"), spot_pool, reference, hours_left)
    # The price rules: the bid caps (`over`: a job there crossed its cap) and the others
    # (the budget: `over_budget`).
    over = np.zeros(price.shape, dtype=bool)
    over_budget = np.zeros(price.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        for _, rule in rules.price_checks:
            if isinstance(rule, BidCap):
                over |= rule.mask(rules, prices)
            else:
                over_budget |= rule.mask(rules, prices)
    candidate = allowed & ~over & ~over_budget

    node = found.node_tflops[found.ids]
    tbps = found.node_tbps[found.ids]
    if rules.per_tflop:
        score = price / node
    elif rules.per_step:  # no job's speed in a backtest: per TFLOP, none without a figure
        with np.errstate(divide="ignore", invalid="ignore"):
            score = np.where(node > 0, price / node, np.inf)
    elif rules.per_tbps:
        score = price / tbps
    else:
        score = price
    # Own first (`markets: [owned, ...]`, the engine's `_owned_first`): an owned candidate
    # ranks ahead of every cloud one whatever the prices, so it scores below them all.
    place = rules.markets.get(Market.OWNED)
    if place is not None and all(i >= place for i in rules.markets.values()):
        owned_pool = market_codes.codes == market_codes.code_of(Market.OWNED)
        score = np.where(owned_pool[None, :], score - OWNED_FIRST, score)
    score = np.where(candidate, score, np.inf)
    return Market_(
        times=times,
        price=price,
        allowed=allowed,
        capped=allowed & over,
        candidate=candidate,
        score=score,
        on_demand=np.where(on_demand_pool, price, reference),
        best=_best(score, _ranks(rules, pools)),
        cheapest_allowed=np.where(allowed & ~over_budget, price, np.inf).min(axis=1)
        if advice
        else np.zeros(0),
        share_allowed=_shares(allowed & ~over_budget, spot_pool, price, reference)
        if advice
        else np.zeros(0),
    )


def _shares(
    allowed: np.ndarray, spot: np.ndarray, price: np.ndarray, reference: np.ndarray
) -> np.ndarray:
    """Per snapshot, the lowest spot-to-on-demand share among allowed offers (0 where an
    allowed offer is not spot: no fraction caps it); inf where none has one."""
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(spot, price / reference, 0.0)
    return np.where(allowed & ~np.isnan(share), share, np.inf).min(axis=1)  # type: ignore[no-any-return]


def _best(score: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per snapshot, the engine's first candidate (a pool row), -1 where there is none:
    the lowest score, ties to the lower rank."""
    by_rank = np.argsort(rank)
    ranked = score[:, by_rank]
    first = ranked.argmin(axis=1)
    found = np.isfinite(ranked[np.arange(len(first)), first])
    return np.where(found, by_rank[first], -1)


def _references(price: np.ndarray, on_demand: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per snapshot and pool: the cheapest fresh on-demand price of its (provider, region,
    instance type); NaN where there is none."""
    out = np.full(price.shape, np.nan)
    members = np.flatnonzero(on_demand)
    if len(members) == 0:
        return out
    members = members[np.argsort(groups[members], kind="stable")]
    member_groups = groups[members]
    starts = np.flatnonzero(np.r_[True, member_groups[1:] != member_groups[:-1]])
    with np.errstate(invalid="ignore"):
        cheapest = np.fmin.reduceat(price[:, members], starts, axis=1)
    table = np.full((price.shape[0], int(groups.max()) + 1), np.nan)
    table[:, member_groups[starts]] = cheapest
    return table[:, groups]  # type: ignore[no-any-return]


def _ranks(rules: RuleSet, pools: OfferTable) -> np.ndarray:
    """Per pool, its place in the engine's tie-break (market preference, provider, region,
    zone, type): two pools never tie on it."""
    offers = pools.offers
    order = sorted(
        range(len(offers)),
        key=lambda i: (
            rules.markets.get(offers[i].market, len(rules.markets)),
            offers[i].provider,
            offers[i].region,
            offers[i].zone or "",
            offers[i].instance_type,
        ),
    )
    rank = np.empty(len(offers), dtype=np.int64)
    rank[order] = np.arange(len(offers))
    return rank


def replay(
    policy: Policy,
    history: History,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    found: Market_ | None = None,
    mover: Mover | None = None,
) -> Backtest:
    """One job under `policy` from the first snapshot to `until` (docs/backtest.md).

    `mover`, where given, is asked at each snapshot on which the job's pool is still a
    candidate whether it moves anyway (the policy's `migration` block)."""
    found = found or market(policy, history, since, until)
    times = found.times
    end = seconds(until) if until is not None else int(times[-1])
    if end < times[-1]:
        raise BacktestError("--until is before the last snapshot")
    winners = found.best.tolist()
    stops = [*times[1:].tolist(), end]
    candidate, capped, price, baseline = found.candidate, found.capped, found.price, found.on_demand
    offers = history.pools.offers
    current = last = -1
    cost = on_demand = idle = unpriced = 0.0
    moves = crossings = migrations = 0
    steps: list[Step] = []
    first_start = placed = 0
    for s, start in enumerate(times.tolist()):
        if current < 0 or not candidate[s, current]:
            if current >= 0 and capped[s, current]:
                crossings += 1
            current = winners[s]
            if current >= 0:
                if last < 0:
                    first_start = start
                if last >= 0 and current != last:
                    moves += 1
                if current != last:
                    placed = start
                last = current
        elif mover is not None:
            target = mover(found, s, current, placed, first_start)
            if target is not None and target != current:
                current = last = target
                moves += 1
                migrations += 1
                placed = start
        hours = (stops[s] - start) / 3600
        usd = reference = None
        if current < 0:
            idle += hours
        else:
            usd = float(price[s, current])
            cost += usd * hours
            reference = float(baseline[s, current])
            if math.isnan(reference):
                reference = None
                unpriced += hours
                on_demand += usd * hours
            else:
                on_demand += reference * hours
        steps.append(
            Step(
                instant(start),
                offers[current] if current >= 0 else None,
                usd,
                reference,
                hours,
                cost,
            )
        )
    return Backtest(
        policy=policy.name,
        start=instant(times[0]),
        end=instant(end),
        snapshots=len(times),
        pools=len(offers),
        cost_usd=cost,
        on_demand_usd=on_demand,
        hours=(end - int(times[0])) / 3600,
        hours_without_candidate=idle,
        hours_without_baseline=unpriced,
        moves=moves,
        cap_crossings=crossings,
        steps=steps,
        migrations=migrations,
    )


@dataclass(frozen=True, slots=True)
class CapAdvice:
    """One cap the advisor weighed: the policy's bid caps replaced by it alone."""

    bid: dict[str, float]  # the bid block replayed ({} for none: the policy's own, if current)
    availability: float  # share of snapshots with a candidate
    backtest: Backtest | None  # None where the cap was not reachable

    def to_dict(self) -> dict[str, Any]:
        return {
            "bid": self.bid,
            "availability": round(self.availability, 6),
            "cost_usd": None if self.backtest is None else round(self.backtest.cost_usd, 2),
            "savings_usd": None if self.backtest is None else round(self.backtest.savings_usd, 2),
        }


@dataclass(frozen=True, slots=True)
class BidAdvice:
    """The lowest caps under which `policy` had a candidate in `target` of snapshots.

    Where a cap is None, `usd_why`/`fraction_why` say why no value of it reaches the target;
    `warnings` say when the history is too short to judge a cap at all."""

    policy: str
    target: float
    snapshots: int
    current: CapAdvice
    usd_per_hour: CapAdvice | None  # None: no cap reaches the target (usd_why says why)
    fraction_of_on_demand: CapAdvice | None  # None: no fraction <= 1 reaches it (fraction_why)
    usd_why: str = ""
    fraction_why: str = ""
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "target_availability": self.target,
            "snapshots": self.snapshots,
            "current": self.current.to_dict(),
            "max_usd_per_hour": None if self.usd_per_hour is None else self.usd_per_hour.to_dict(),
            "max_fraction_of_on_demand": None
            if self.fraction_of_on_demand is None
            else self.fraction_of_on_demand.to_dict(),
            "why_none": {
                k: v
                for k, v in (
                    ("max_usd_per_hour", self.usd_why),
                    ("max_fraction_of_on_demand", self.fraction_why),
                )
                if v
            },
            "warnings": list(self.warnings),
        }


# Too short a history to judge a cap (`advise_bid`'s warnings): spot prices move with the day
# and the week, so less than a day says little; and a target is only resolved by enough
# snapshots that one of them is at most a fifth of the misses it allows (0.95: 100 snapshots).
SHORTEST_SPAN = timedelta(days=1)
SNAPSHOTS_PER_MISS = 5


def _too_short(times: np.ndarray, target: float) -> tuple[str, ...]:
    span = timedelta(seconds=float(times[-1] - times[0])) if len(times) else timedelta(0)
    said = []
    if span < SHORTEST_SPAN:
        said.append(
            f"the history covers {span.total_seconds() / 3600:.1f} h: too short to judge a cap "
            f"(spot prices move with the day and the week; give at least "
            f"{SHORTEST_SPAN.total_seconds() / 3600:.0f} h)"
        )
    if target < 1:
        needed = math.ceil(SNAPSHOTS_PER_MISS / (1 - target) - 1e-9)
        if len(times) < needed:
            said.append(
                f"{len(times)} snapshots cannot resolve a target of {target:.1%} "
                f"(at least {needed} are needed)"
            )
    return tuple(said)


# A cap is above zero (the policy schema's rule); where the history's lowest need is a free
# offer, the advice is the smallest cap a price's four decimals can tell from zero.
SMALLEST_CAP = 0.0001


def _lowest(needs: np.ndarray, target: float) -> float | None:
    """The smallest value v such that needs <= v in at least `target` of snapshots."""
    k = max(1, math.ceil(target * len(needs) - 1e-9))
    value = float(np.sort(needs)[k - 1])
    return value if math.isfinite(value) else None


def advise_bid(
    policy: Policy,
    history: History,
    target: float,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    mover: Callable[[], Mover] | None = None,
) -> BidAdvice:
    """The lowest `max_usd_per_hour` (and `max_fraction_of_on_demand`) that gives the policy
    a candidate in at least `target` of the snapshots, each replayed in place of the
    policy's bid caps, next to the policy as written (docs/backtest.md). `mover` makes a
    fresh `Mover` for each replay, so the costs include the policy's migration block as
    `gpuopt backtest` replays it."""
    if not 0 < target <= 1:
        raise BacktestError(f"target availability must be within (0, 1], got {target}")
    current = market(policy, history, since, until, advice=True)
    snapshots_n = len(current.times)

    def availability(found: Market_) -> float:
        return float((found.best >= 0).mean())

    def run(found: Market_) -> Backtest:
        return replay(policy, history, since, until, found=found, mover=mover() if mover else None)

    def weigh(cap: dict[str, float]) -> CapAdvice:
        found = market(policy, history, since, until, bid=cap)
        return CapAdvice(cap, availability(found), run(found))

    mine = CapAdvice({}, availability(current), run(current))
    usd = _lowest(current.cheapest_allowed, target)
    by_usd = None if usd is None else weigh({"max_usd_per_hour": max(usd, SMALLEST_CAP)})
    fraction = _lowest(current.share_allowed, target)
    by_fraction = None
    if fraction is not None and fraction <= 1:
        by_fraction = weigh({"max_fraction_of_on_demand": max(fraction, SMALLEST_CAP)})
    reachable = float(np.isfinite(current.cheapest_allowed).mean())
    usd_why = (
        ""
        if by_usd is not None
        else (
            f"at any price, the policy's other rules left a candidate in only {reachable:.1%} "
            f"of snapshots"
        )
    )
    fraction_why = ""
    if by_fraction is None:
        priced = float(np.isfinite(current.share_allowed).mean())
        if fraction is not None:
            fraction_why = f"it would take {fraction:.2f}x on-demand, a cap above on-demand"
        elif priced < reachable:
            fraction_why = (
                f"only {priced:.1%} of snapshots had an on-demand price to compare against"
            )
        else:
            fraction_why = usd_why
    return BidAdvice(
        policy.name,
        target,
        snapshots_n,
        mine,
        by_usd,
        by_fraction,
        usd_why,
        fraction_why,
        _too_short(current.times, target),
    )
