"""What the prices page charts for a GPU model across regions: per region and market, the
cheapest pool of that model (optionally of one GPU count) over the window, in USD per
GPU-hour so that machines of 1, 4 or 8 GPUs compare; and, where a policy is chosen, the bid
cap it would set on that cheapest spot pool.

The window is cut into at most MAX_POINTS buckets (store/buckets.py): the store hands back
one row per bucket and pool, and a series' point is the lowest price in effect in its
region during the bucket. A chart's size and its read stay bounded whatever the store holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from fnmatch import fnmatchcase
from typing import Any

from optimizer.api.state import ApiState
from optimizer.clock import utc_text
from optimizer.model import Market, Offer, Pool
from optimizer.store import Grid, InEffect
from optimizer.ui.prices import MAX_DAYS, bid_cap
from policies.schema import Policy

MAX_POINTS = 300  # buckets per series, whatever the window
MARKETS = (Market.SPOT, Market.ON_DEMAND)

Column = Sequence[InEffect | None]


@dataclass(frozen=True, slots=True)
class Choice:
    """What the form picked: a GPU model, optionally a GPU count, one market (None: both)
    and region globs (none: every region)."""

    gpu: str
    gpus: int | None = None
    market: Market | None = None
    regions: tuple[str, ...] = ()
    days: int = 2

    def wants(self, offer: Offer) -> bool:
        return (
            offer.gpu_model == self.gpu
            and offer.market in MARKETS
            and (self.gpus is None or offer.gpu_count == self.gpus)
            and (self.market is None or offer.market is self.market)
            and (not self.regions or any(fnmatchcase(offer.region, g) for g in self.regions))
        )


def region_globs(text: str) -> tuple[str, ...]:
    """`eu-* europe-*` or `eu-*, europe-*`: the globs, in order, without repeats."""
    return tuple(dict.fromkeys(g for g in re.split(r"[\s,]+", text) if g))


def models(offers: Sequence[Offer]) -> list[tuple[str, list[int]]]:
    """Every GPU model among the latest spot and on-demand offers, with its GPU counts."""
    found: dict[str, set[int]] = {}
    for o in offers:
        if o.market in MARKETS and o.gpu_count > 0 and o.gpu_model:
            found.setdefault(o.gpu_model, set()).add(o.gpu_count)
    return [(model, sorted(counts)) for model, counts in sorted(found.items())]


def pools_to_read(
    offers: Sequence[Offer], choice: Choice, policy: Policy | None
) -> tuple[list[Offer], list[Offer]]:
    """(the pools the chart shows, the on-demand pools a bid cap also needs): a cap as a
    fraction of on-demand reads the on-demand price of each shown spot pool's instance type
    in its region, shown or not."""
    shown = [o for o in offers if choice.wants(o)]
    extra: list[Offer] = []
    if policy is not None and policy.bid.max_fraction_of_on_demand is not None:
        have = {o.pool for o in shown}
        types = {(o.provider, o.region, o.instance_type) for o in shown if o.market is Market.SPOT}
        extra = [
            o
            for o in offers
            if o.market is Market.ON_DEMAND
            and (o.provider, o.region, o.instance_type) in types
            and o.pool not in have
        ]
    return shown, extra


def _cheapest(
    pools: Sequence[Offer], columns: Mapping[Pool, Column], index: int, end: bool
) -> tuple[float, Offer] | None:
    """The lowest price per GPU-hour among `pools` in bucket `index` (at its end with
    `end`), and the pool that has it (the first in order on a tie)."""
    best: tuple[float, Offer] | None = None
    for o in pools:
        found = columns[o.pool][index]
        if found is None:
            continue
        value = (found.end if end else found.low) / o.gpu_count
        if best is None or value < best[0]:
            best = (value, o)
    return best


def _on_demand(
    by_type: Mapping[tuple[str, str, str], Sequence[Offer]],
    columns: Mapping[Pool, Column],
    spot: Offer,
    index: int,
) -> float | None:
    """The on-demand price of `spot`'s instance type in its region at the end of bucket
    `index` (its cheapest zone where priced per zone)."""
    prices = [
        found.end
        for o in by_type.get((spot.provider, spot.region, spot.instance_type), ())
        if (found := columns[o.pool][index]) is not None
    ]
    return min(prices, default=None)


def series(
    grid: Grid,
    shown: Sequence[Offer],
    extra: Sequence[Offer],
    columns: Mapping[Pool, Column],
    policy: Policy | None,
) -> dict[str, Any]:
    """The chart's columns: per (provider, region, market) of `shown`, the cheapest pool's
    price per GPU-hour in each bucket, with its figures; for spot, the bid cap `policy` sets
    on that pool (one `caps` entry when every region's cap is the same)."""
    groups: dict[tuple[str, str, Market], list[Offer]] = {}
    for o in shown:
        groups.setdefault((o.provider, o.region, o.market), []).append(o)
    by_type: dict[tuple[str, str, str], list[Offer]] = {}
    for o in [*shown, *extra]:
        if o.market is Market.ON_DEMAND:
            by_type.setdefault((o.provider, o.region, o.instance_type), []).append(o)
    out: list[dict[str, Any]] = []
    caps: list[tuple[int, list[float | None]]] = []
    order = sorted(groups, key=lambda k: (k[0], k[1], MARKETS.index(k[2])))
    for provider, region, market in order:
        pools = groups[(provider, region, market)]
        values: list[float | None] = []
        cap: list[float | None] = []
        for index in range(grid.count):
            found = _cheapest(pools, columns, index, end=False)
            values.append(None if found is None else found[0])
            if policy is not None and market is Market.SPOT:
                if found is None:
                    cap.append(None)
                    continue
                offer = found[1]
                limit = bid_cap(policy, offer.gpu_count, _on_demand(by_type, columns, offer, index))
                cap.append(None if limit is None else limit / offer.gpu_count)
        now = _cheapest(pools, columns, grid.count - 1, end=True)
        known = [v for v in values if v is not None]
        if cap:
            caps.append((len(out), cap))
        out.append(
            {
                "provider": provider,
                "region": region,
                "market": market.value,
                "label": f"{provider} {region} {market.value.replace('_', '-')}",
                "values": values,
                "now": None if now is None else now[0],
                "now_pool": None if now is None else _pool_label(now[1]),
                "low": min(known, default=None),
                "high": max(known, default=None),
                "cap_now": cap[-1] if cap else None,
            }
        )
    caps = [(i, c) for i, c in caps if any(v is not None for v in c)]
    lines: list[dict[str, Any]]
    if len(caps) > 1 and len({tuple(c) for _, c in caps}) == 1:  # one cap everywhere
        lines = [{"label": "bid cap", "of": None, "values": caps[0][1]}]
    else:
        lines = [{"label": f"bid cap {out[i]['label']}", "of": i, "values": c} for i, c in caps]
    return {"series": out, "caps": lines}


def _pool_label(o: Offer) -> str:
    return f"{o.zone or o.region} {o.instance_type} ({o.gpu_count}\u00d7)"


def history(state: ApiState, choice: Choice, policy: Policy | None) -> dict[str, Any]:
    """The GPU model's chart data over the last `choice.days` days of the daemon's clock."""
    now = state.clock()
    since = now - timedelta(days=max(1, min(choice.days, MAX_DAYS)))
    grid = Grid.over(since, now, MAX_POINTS)
    prices = state.store.prices
    shown, extra = pools_to_read(prices.latest_offers(), choice, policy)
    read = [*shown, *extra]
    found = prices.price_buckets([o.pool for o in read], grid)
    columns = {o.pool: column for o, column in zip(read, found, strict=True)}
    data = series(grid, shown, extra, columns, policy)
    data["t"] = [grid.start(i).timestamp() for i in range(grid.count)]
    data["summary"] = {
        "gpu": choice.gpu,
        "gpus": choice.gpus,
        "market": None if choice.market is None else choice.market.value,
        "regions": list(choice.regions),
        "unit": "USD per GPU-hour",
        "bucket_s": grid.width_s,
        "points": grid.count,
        "pools": len(read),
        "since": utc_text(grid.origin),
        "until": utc_text(now),
    }
    return data
