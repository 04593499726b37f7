"""The local cloud's price list: the bundled snapshot's on-demand rows plus simulated spot.

Each snapshot row becomes an on-demand offer of the local cloud (provider `local`, the row's
own region and instance type, its list price and source) and one spot offer per synthesised
zone (`<region>-a`, `<region>-b`). Spot prices follow a seeded random walk of the discount
below on-demand, in 10-minute steps, re-anchored once a simulated day (GCP changes spot
prices at most daily; AWS more often). The walk is a pure function of (seed, pool, time), so
two processes with one seed agree on every price. Spot offers carry `source="simulated"`.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from optimizer.model import Market, Offer

ZONE_SUFFIXES = ("a", "b")
STEP_S = 600.0  # one walk step: 10 minutes
STEPS_PER_ANCHOR = 144  # one simulated day of steps between re-anchorings
STEP_SIGMA = 0.02  # the discount moves by up to this fraction of on-demand per step
MEMO_DAYS = 20_000  # (pool, day) walks kept: a week of every pool, 1.2 KiB each
SIMULATED = "simulated"


def zones_of(region: str) -> list[str]:
    return [f"{region}-{suffix}" for suffix in ZONE_SUFFIXES]


class SpotWalk:
    """The spot discount of each pool at a time: `lo <= discount <= hi` of on-demand."""

    def __init__(self, seed: int, discount: tuple[float, float]) -> None:
        lo, hi = discount
        if not 0 <= lo <= hi < 1:
            raise ValueError(f"spot_discount must satisfy 0 <= lo <= hi < 1, got {discount}")
        self.seed, self.lo, self.hi = seed, lo, hi
        self._memo: dict[tuple[str, int], array[float]] = {}

    def forget(self) -> None:
        """Drop the days walked so far (a history's backfill walks a week of every pool)."""
        self._memo.clear()

    def discount(self, pool: str, t: float) -> float:
        anchor, offset = divmod(int(t // STEP_S), STEPS_PER_ANCHOR)
        return self.day(pool, anchor)[offset]

    def day(self, pool: str, anchor: int) -> array[float]:
        """The discount at each of one simulated day's steps: the walk from its anchor, taken
        once (a price at any step of the day, or a whole day of history, reads it)."""
        key = (pool, anchor)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) > MEMO_DAYS:
                self._memo.clear()
            found = self._memo[key] = self._walk(pool, anchor)
        return found

    def _walk(self, pool: str, anchor: int) -> array[float]:
        rng = random.Random(f"{self.seed}|{pool}|{anchor}")
        value = rng.uniform(self.lo, self.hi)
        out = array("d", [value])
        for _ in range(STEPS_PER_ANCHOR - 1):
            value += rng.uniform(-STEP_SIGMA, STEP_SIGMA)
            # Reflect at the bounds so the walk stays inside [lo, hi].
            if value < self.lo:
                value = 2 * self.lo - value
            if value > self.hi:
                value = 2 * self.hi - value
            value = min(max(value, self.lo), self.hi)
            out.append(value)
        return out


def spot_usd(
    walk: SpotWalk, on_demand_usd: float, region: str, zone: str, instance_type: str, t: float
) -> float:
    """A spot pool's simulated price at epoch time `t`: its on-demand price less the walk's
    discount, to five decimals."""
    cut = walk.discount(f"{region}|{zone}|{instance_type}", t)
    return round(on_demand_usd * (1 - cut), 5)


def local_offers(
    snapshot: Sequence[Offer],
    walk: SpotWalk,
    now: float,
    regions: Sequence[str] | None = None,
    pins: Mapping[str, float] | None = None,
) -> list[Offer]:
    """On-demand and simulated spot offers of the local cloud at epoch time `now`; `pins`
    holds some pools' prices instead (by `type@zone` or `type@region`, market.py)."""
    pins = pins or {}
    wanted = None if regions is None else set(regions)
    observed = datetime.fromtimestamp(now, UTC)
    out: list[Offer] = []
    for row in snapshot:
        if row.market is not Market.ON_DEMAND or (wanted is not None and row.region not in wanted):
            continue
        on_demand = replace(
            row,
            provider="local",
            zone=None,
            observed_at=observed,
            source=f"{row.source} (local cloud list price)" if row.source else "snapshot",
        )
        held = pins.get(f"{row.instance_type}@{row.region}")
        if held is not None:
            on_demand = replace(on_demand, usd_per_hour=held, source=SIMULATED)
        out.append(on_demand)
        for zone in zones_of(row.region):
            usd = pins.get(f"{row.instance_type}@{zone}")
            if usd is None:
                usd = spot_usd(walk, row.usd_per_hour, row.region, zone, row.instance_type, now)
            out.append(
                replace(
                    on_demand,
                    zone=zone,
                    market=Market.SPOT,
                    usd_per_hour=usd,
                    source=SIMULATED,
                )
            )
    return out
