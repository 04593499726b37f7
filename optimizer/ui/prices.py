"""What the prices page charts: one pool's spot price history beside the on-demand price of
the same instance type in its region, and a policy's bid cap over them, on one time axis
(step lines: each price holds until the next point, as GET /prices/history says)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from optimizer.api.state import ApiState
from optimizer.clock import utc_text
from optimizer.model import Market, Offer
from optimizer.store import PricePoint
from policies import rulebook
from policies.schema import Policy

MAX_DAYS = 30
MAX_POINTS = 10_000


@dataclass(frozen=True, slots=True)
class PoolKey:
    provider: str
    region: str
    zone: str | None
    instance_type: str

    @property
    def value(self) -> str:
        """The form's value for this pool."""
        return "|".join((self.provider, self.region, self.zone or "", self.instance_type))

    @property
    def label(self) -> str:
        return f"{self.provider} {self.zone or self.region} {self.instance_type}"

    @classmethod
    def parse(cls, value: str) -> PoolKey | None:
        parts = value.split("|")
        if len(parts) != 4 or not all(parts[i] for i in (0, 1, 3)):
            return None
        return cls(parts[0], parts[1], parts[2] or None, parts[3])


def spot_pools(offers: Sequence[Offer]) -> list[tuple[PoolKey, Offer]]:
    """Every spot pool among the latest offers (cheapest offer of each), sorted by name."""
    found: dict[PoolKey, Offer] = {}
    for o in offers:
        if o.market is not Market.SPOT:
            continue
        key = PoolKey(o.provider, o.region, o.zone, o.instance_type)
        if key not in found or o.usd_per_hour < found[key].usd_per_hour:
            found[key] = o
    return sorted(found.items(), key=lambda kv: kv[0].label)


def bid_cap(policy: Policy, gpu_count: int, on_demand: float | None) -> float | None:
    """The highest spot price `policy`'s bid caps allow for an instance of `gpu_count` GPUs
    when on-demand costs `on_demand` (the caps' own limits: `policies.rulebook.bid_cap`;
    None: no cap)."""
    return rulebook.bid_cap(policy.bid, gpu_count, on_demand)


def _at(points: Sequence[PricePoint], times: Sequence[float], t: float) -> float | None:
    i = bisect_right(times, t) - 1
    return points[i].usd_per_hour if i >= 0 else None


def series(
    spot: Sequence[PricePoint],
    on_demand: Sequence[PricePoint],
    policy: Policy | None,
    gpu_count: int,
) -> dict[str, list[Any]]:
    """uPlot's columns over the union of both histories' instants: each price in effect at
    each instant (None before a series' first point), and the bid cap there."""
    spot_t = [p.at.timestamp() for p in spot]
    od_t = [p.at.timestamp() for p in on_demand]
    times = sorted(set(spot_t) | set(od_t))
    out: dict[str, list[Any]] = {"t": times, "spot": [], "on_demand": [], "cap": []}
    for t in times:
        od = _at(on_demand, od_t, t)
        out["spot"].append(_at(spot, spot_t, t))
        out["on_demand"].append(od)
        out["cap"].append(None if policy is None else bid_cap(policy, gpu_count, od))
    return out


def history(
    state: ApiState, pool: PoolKey, days: int, policy: Policy | None, gpu_count: int
) -> dict[str, Any]:
    """The pool's chart data over the last `days` days of the daemon's clock."""
    now = state.clock()
    since = now - timedelta(days=max(1, min(days, MAX_DAYS)))
    prices = state.store.prices
    spot = prices.price_points(
        pool.provider,
        pool.region,
        pool.zone,
        pool.instance_type,
        Market.SPOT,
        since,
        None,
        prior=True,
        limit=MAX_POINTS,
    )
    on_demand = prices.price_points(
        pool.provider,
        pool.region,
        None,
        pool.instance_type,
        Market.ON_DEMAND,
        since,
        None,
        prior=True,
        limit=MAX_POINTS,
    )
    data: dict[str, Any] = dict(series(spot, on_demand, policy, gpu_count))
    values = [v for v in data["spot"] if v is not None]
    data["summary"] = {
        "points": len(spot),
        "spot_min": min(values, default=None),
        "spot_max": max(values, default=None),
        "spot_latest": values[-1] if values else None,
        "on_demand_latest": next((v for v in reversed(data["on_demand"]) if v is not None), None),
        "cap_latest": next((v for v in reversed(data["cap"]) if v is not None), None),
        "since": utc_text(since),
        "until": utc_text(now),
    }
    return data
