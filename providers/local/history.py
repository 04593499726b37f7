"""The local cloud's price history, made rather than waited for.

The local cloud's prices are a pure function of (seed, pool, time) (`prices.py`), so a fresh
daemon need not wait days for a history: `backfill` writes the prices the local cloud had at
each hour of the last `days` before the store's first local observation, labelled as they
are when polled (spot `simulated`). Backtests, the console's charts and the interruption
model have data from the first minute; `gpuopt local history --days N` does the same on
demand. The daemon does it once at start, as the leader, with `providers.local.history_days`
(7 by default; 0 turns it off).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from optimizer.model import Market, Pool
from providers.local.cloud import LocalCloud
from providers.local.prices import spot_usd

log = logging.getLogger(__name__)

HISTORY_STEP = timedelta(hours=1)  # one point per pool and hour (the walk moves every 10 min)
DEFAULT_DAYS = 7
MAX_DAYS = 90


@dataclass(frozen=True, slots=True)
class Backfilled:
    """What a backfill wrote: the span (empty when nothing was missing) and its points."""

    start: datetime
    end: datetime
    points: int
    seconds: float

    def summary(self) -> str:
        if self.points == 0:
            return "the local cloud's history already covers that span: nothing to add"
        hours = (self.end - self.start) / timedelta(hours=1)
        return (
            f"local cloud: {self.points:,} simulated price points over {hours:,.0f} h "
            f"({self.start:%Y-%m-%d %H:%M} to {self.end:%Y-%m-%d %H:%M} UTC) in "
            f"{self.seconds:.1f} s"
        )


def span(now: datetime, days: float, earliest: datetime | None) -> tuple[datetime, datetime] | None:
    """The hours to fill: from `days` before `now` (on the hour) to the store's first local
    observation (or `now`); None when that is empty."""
    if days <= 0:
        return None
    start = (now - timedelta(days=days)).replace(minute=0, second=0, microsecond=0)
    end = min(earliest, now) if earliest is not None else now
    return (start, end) if start < end else None


Point = tuple[Pool, float, datetime, str]  # a pool's price at a time, and its source


def points(cloud: LocalCloud, start: datetime, end: datetime) -> Iterator[Point]:
    """The local cloud's prices at each history step in [start, end), oldest first: the
    on-demand list prices once, at `start` (they do not move), and every spot pool's price at
    every step (the walk, as `fetch_offers` prices it then)."""
    offers = cloud.offers_at(start.timestamp())
    on_demand = {
        (o.region, o.instance_type): o.usd_per_hour for o in offers if o.market is Market.ON_DEMAND
    }
    for o in offers:
        if o.market is Market.ON_DEMAND:
            yield o.pool, o.usd_per_hour, start, o.source
    spot = [o for o in offers if o.market is Market.SPOT]
    t = start
    while t < end:
        epoch = t.timestamp()
        for o in spot:
            usd = spot_usd(
                cloud.walk, on_demand[(o.region, o.instance_type)], o.region, o.zone or "",
                o.instance_type, epoch,
            )  # fmt: skip
            yield o.pool, usd, t, o.source
        t += HISTORY_STEP


def backfill(
    cloud: LocalCloud,
    record: Callable[[Iterable[Point]], int],
    earliest: datetime | None,
    *,
    now: datetime,
    days: float = DEFAULT_DAYS,
    batch: int = 24,
    cancelled: Callable[[], bool] = lambda: False,
) -> Backfilled:
    """Write the local cloud's prices at each hour of the `days` before `earliest` (the store's
    first local observation; None: before `now`): `batch` hours per `record` call (one
    transaction each, with the on-demand prices at its first hour), newest batch first, so
    that `cancelled` (the daemon stopping) ends it between batches with a history that has no
    gap, only a later start (a later run fills what is before it)."""
    started = time.monotonic()
    found = span(now.astimezone(UTC), days, earliest)
    if found is None:
        return Backfilled(now, now, 0, 0.0)
    start, end = found
    hours = -(-(end - start) // HISTORY_STEP)  # the steps at start, start + 1 h, ... before end
    written, filled = 0, hours  # the steps [filled, hours) are written
    while filled > 0 and not (written and cancelled()):
        first = max(0, filled - batch)
        written += record(
            points(cloud, start + first * HISTORY_STEP, min(end, start + filled * HISTORY_STEP))
        )
        filled = first
    return Backfilled(start + filled * HISTORY_STEP, end, written, time.monotonic() - started)


__all__ = [
    "DEFAULT_DAYS",
    "HISTORY_STEP",
    "MAX_DAYS",
    "Backfilled",
    "Point",
    "backfill",
    "points",
    "span",
]
