"""Replaying a policy over a price history (docs/backtest.md has the semantics in words).

Pure and columnar: the history is three point columns (pool, time, price) and one row of
hardware per pool. Prices go into a snapshots x pools matrix, filled forward (a pool's price
at a snapshot is its latest observation at or before it); the shape rules run once per pool
(`policies.columnar.shapes`), and stale, the bid caps and the budget run over the whole matrix
at once, with the same formulas as the engine. Only the job's walk from snapshot to snapshot
is a Python loop, one step per snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from optimizer.model import Market, Offer
from policies import budget
from policies.columnar import PASSED, shapes
from policies.rules import _SLACK, RuleSet
from policies.schema import Policy
from policies.table import OfferTable

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


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
    score: np.ndarray  # what rank_by orders on
    on_demand: np.ndarray  # per pool: the baseline price; NaN where none
    rank: np.ndarray  # per pool: position in the engine's tie-break order
    over_budget: np.ndarray  # bool: allowed, under the caps, fails the budget rule


def snapshots(history: History, since: datetime | None, until: datetime | None) -> np.ndarray:
    """The replay's snapshot times: distinct observation times within [since, until]."""
    times = np.unique(history.at)
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
    caps: bool = True,
) -> Market_:
    """The matrices a replay walks (module docstring); `caps=False` leaves the bid caps out
    of `candidate` (advise-bid reads what each snapshot would need)."""
    times = snapshots(history, since, until)
    if len(times) == 0:
        raise BacktestError("the history has no observation in the window")
    every = np.unique(history.at)
    n_pools = len(history.pools)
    filled = np.full((len(every), n_pools), -1, dtype=np.int64)
    # Each point's index in the point arrays, at its (time, pool) cell; a later row of the
    # same pool and time wins. Filling forward then gives each cell its latest point.
    order = np.argsort(history.at, kind="stable")
    rows = np.searchsorted(every, history.at[order])
    filled[rows, history.pool[order]] = order
    np.maximum.accumulate(filled, axis=0, out=filled)
    picked = filled[np.searchsorted(every, times)]
    del filled
    exists = picked >= 0
    price = np.where(exists, history.usd_per_hour[picked], np.nan)

    rules = RuleSet(policy, instant(times[0]))
    found = shapes(rules, history.pools)
    shape_ok = found.rule[found.ids] == PASSED
    fresh = exists.copy()
    if policy.max_price_age_hours is not None:
        observed = np.where(exists, history.at[picked], 0)
        oldest = times[:, None] - policy.max_price_age_hours * 3600
        fresh &= observed >= oldest
    del picked
    price = np.where(fresh, price, np.nan)
    allowed = fresh & shape_ok[None, :]

    pools = history.pools
    market_codes = pools.column("market")
    on_demand_pool = market_codes.codes == market_codes.code_of(Market.ON_DEMAND)
    spot_pool = market_codes.codes == market_codes.code_of(Market.SPOT)
    groups, _ = pools.group(("provider", "region", "instance_type"))
    reference = _references(price, on_demand_pool, groups)
    count = pools.number("gpu_count")

    over = np.zeros(price.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        if rules.max_usd_per_hour is not None:
            over |= price > rules.max_usd_per_hour * (1 + _SLACK)
        if rules.max_usd_per_gpu_hour is not None:
            over |= price > rules.max_usd_per_gpu_hour * count * (1 + _SLACK)
        if rules.max_fraction is not None:
            no_reference = np.isnan(reference)
            over |= spot_pool & (
                no_reference | (price > rules.max_fraction * reference * (1 + _SLACK))
            )
        over_budget = np.zeros(price.shape, dtype=bool)
        if rules.monthly_usd is not None:
            hours = np.array(
                [budget.hours_left(instant(t), rules.hours_per_month) for t in times.tolist()]
            )
            monthly = price * hours[:, None]  # nothing spent: see docs/backtest.md
            over_budget = monthly > rules.monthly_usd * (1 + _SLACK)
    capped = allowed & over
    candidate = allowed & ~over_budget & (~over if caps else True)

    node = found.node_tflops[found.ids]
    tbps = found.node_tbps[found.ids]
    if rules.per_tflop:
        score = price / node
    elif rules.per_tbps:
        score = price / tbps
    else:
        score = price
    baseline = np.where(on_demand_pool, price, reference)
    return Market_(
        times=times,
        price=price,
        allowed=allowed,
        capped=capped,
        candidate=candidate,
        score=score,
        on_demand=baseline,
        rank=_ranks(rules, pools),
        over_budget=allowed & ~over & over_budget,
    )


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


def best(found: Market_) -> np.ndarray:
    """Per snapshot, the engine's first candidate (a pool row), -1 where there is none."""
    by_rank = np.argsort(found.rank)
    score = np.where(found.candidate, found.score, np.inf)[:, by_rank]
    first = score.argmin(axis=1)
    winner = by_rank[first]
    return np.where(np.isfinite(score[np.arange(len(first)), first]), winner, -1)


def replay(
    policy: Policy,
    history: History,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    found: Market_ | None = None,
) -> Backtest:
    """One job under `policy` from the first snapshot to `until` (docs/backtest.md)."""
    found = found or market(policy, history, since, until)
    times = found.times
    end = seconds(until) if until is not None else int(times[-1])
    if end < times[-1]:
        raise BacktestError("--until is before the last snapshot")
    winners = best(found).tolist()
    stops = [*times[1:].tolist(), end]
    candidate, capped, price, baseline = found.candidate, found.capped, found.price, found.on_demand
    offers = history.pools.offers
    current = last = -1
    cost = on_demand = idle = unpriced = 0.0
    moves = crossings = 0
    steps: list[Step] = []
    for s, start in enumerate(times.tolist()):
        if current < 0 or not candidate[s, current]:
            if current >= 0 and capped[s, current]:
                crossings += 1
            current = winners[s]
            if current >= 0:
                if last >= 0 and current != last:
                    moves += 1
                last = current
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
    """The lowest caps under which `policy` had a candidate in `target` of snapshots."""

    policy: str
    target: float
    snapshots: int
    current: CapAdvice
    usd_per_hour: CapAdvice | None  # None: no cap reaches the target
    fraction_of_on_demand: CapAdvice | None  # None: no fraction <= 1 reaches it

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
        }


def _with_bid(policy: Policy, bid: dict[str, float]) -> Policy:
    return policy.model_copy(update={"bid": policy.bid.model_validate(bid)})


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
) -> BidAdvice:
    """The lowest `max_usd_per_hour` (and `max_fraction_of_on_demand`) that gives the policy
    a candidate in at least `target` of the snapshots, each replayed in place of the
    policy's bid caps, next to the policy as written (docs/backtest.md)."""
    if not 0 < target <= 1:
        raise BacktestError(f"target availability must be within (0, 1], got {target}")
    current = market(policy, history, since, until)
    free = market(_with_bid(policy, {}), history, since, until)
    snapshots_n = len(free.times)

    def availability(found: Market_) -> float:
        return float(found.candidate.any(axis=1).mean())

    ran = replay(policy, history, since, until, found=current)
    mine = CapAdvice({}, availability(current), ran)
    cheapest = np.where(free.candidate, free.price, np.inf).min(axis=1)
    usd = _lowest(cheapest, target)
    by_usd = None
    if usd is not None:
        capped_policy = _with_bid(policy, {"max_usd_per_hour": usd})
        found = market(capped_policy, history, since, until)
        by_usd = CapAdvice(
            {"max_usd_per_hour": usd},
            availability(found),
            replay(capped_policy, history, since, until, found=found),
        )
    pools = history.pools.column("market")
    spot = pools.codes == pools.code_of(Market.SPOT)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(spot, free.price / free.on_demand, 0.0)  # on-demand pools: no cap
    share = np.where(free.candidate & ~np.isnan(share), share, np.inf)
    fraction = _lowest(share.min(axis=1), target)
    by_fraction = None
    if fraction is not None and 0 < fraction <= 1:
        capped_policy = _with_bid(policy, {"max_fraction_of_on_demand": fraction})
        found = market(capped_policy, history, since, until)
        by_fraction = CapAdvice(
            {"max_fraction_of_on_demand": fraction},
            availability(found),
            replay(capped_policy, history, since, until, found=found),
        )
    return BidAdvice(policy.name, target, snapshots_n, mine, by_usd, by_fraction)
