"""Price history in two tiers, and how it ages.

Raw points (`price_history`, one row per observation) are kept for the raw retention; then
each pool's points of one hour become one `price_hourly` row (min, median, max and how many
points), kept for the hourly retention; then they go. An hour moves on only once all of it is
older than the retention: a raw point is kept at least the raw retention and at most an hour
more, and likewise an hourly row.

Reading (`points_in_effect`) gives one pool's points across both tiers, oldest first: raw
points where they exist, and for the older hours each hour's median at the start of the hour.

Pruning (`prune_batch`) works through the pools in key order in bounded batches, each one
transaction: the raw points of an hour are deleted and summarized in the same transaction
(the DELETE … RETURNING hands back exactly the rows it removed), so a crash between the two
can neither lose an hour nor count it twice, and a second run finds nothing left to do.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Connection,
    Select,
    delete,
    literal,
    literal_column,
    select,
    tuple_,
    union_all,
)

from optimizer.store.engine import dialect_insert, table
from optimizer.store.tables import POOL_COLUMNS, PriceHistory, PriceHourly

_RAW = table(PriceHistory)
_HOURLY = table(PriceHourly)
HOUR = timedelta(hours=1)

PoolKey = tuple[str, str, str, str, str]
"""A pool as the store keys it: (provider, region, zone or '', instance type, market)."""


class Tier(StrEnum):
    """Where a point comes from: one observation, or one hour's summary."""

    RAW = "raw"
    HOURLY = "hourly"


@dataclass(frozen=True, slots=True)
class PricePoint:
    """A price in effect from `at` until the next point.

    Raw: one observation (min = max = the price, points = 1). Hourly: the hour starting at
    `at`, summarized; `usd_per_hour` is its median.
    """

    at: datetime
    usd_per_hour: float
    tier: Tier
    min_usd: float
    max_usd: float
    points: int


@dataclass(frozen=True, slots=True)
class HourSummary:
    hour: datetime
    min_usd: float
    median_usd: float
    max_usd: float
    points: int


@dataclass(frozen=True, slots=True)
class Retention:
    """How long each tier is kept."""

    raw: timedelta
    hourly: timedelta

    def __post_init__(self) -> None:
        if self.raw <= timedelta(0):
            raise ValueError("the raw retention must be positive")
        if self.hourly <= self.raw:
            raise ValueError("the hourly retention must be longer than the raw retention")

    def raw_cutoff(self, now: datetime) -> datetime:
        """Raw points before this are summarized (their hour is wholly past the retention)."""
        return floor_hour(now - self.raw)

    def hourly_cutoff(self, now: datetime) -> datetime:
        """Hourly rows before this, and raw points before it, are removed."""
        return floor_hour(now - self.hourly)


@dataclass(frozen=True, slots=True)
class PruneBatch:
    """What one batch did, and where the next one starts."""

    pools: int = 0  # pools visited
    summarized: int = 0  # raw points folded into hourly rows
    hours: int = 0  # hourly rows written or updated
    dropped: int = 0  # raw points past both retentions, removed without a summary
    expired: int = 0  # hourly rows past the hourly retention, removed
    after: PoolKey | None = None  # the next batch starts after this pool
    done: bool = False  # no pool is left in this pass

    @property
    def rows(self) -> int:
        """Rows removed in this batch."""
        return self.summarized + self.dropped + self.expired


# -- the pure part ---------------------------------------------------------------------------


def floor_hour(at: datetime) -> datetime:
    """The start of the UTC hour holding `at`."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def summarize(points: Iterable[tuple[datetime, float]]) -> list[HourSummary]:
    """One summary per UTC hour that has points, oldest first. The median of an even number
    of points is the mean of the middle two (`statistics.median`)."""
    hours: dict[datetime, list[float]] = {}
    for at, usd in points:
        hours.setdefault(floor_hour(at), []).append(usd)
    return [
        HourSummary(hour, min(prices), statistics.median(prices), max(prices), len(prices))
        for hour, prices in sorted(hours.items())
    ]


def merge(held: HourSummary, more: HourSummary, prices: Sequence[float]) -> HourSummary:
    """An hour already summarized (`held`) with `prices` that arrived for it later (`more`
    summarizes them). Min, max and count are exact; the median is taken over the held
    median counted once per point it stood for, and the new prices."""
    values = sorted([held.median_usd] * held.points + list(prices))
    return HourSummary(
        held.hour,
        min(held.min_usd, more.min_usd),
        statistics.median(values),
        max(held.max_usd, more.max_usd),
        held.points + more.points,
    )


# -- reading ---------------------------------------------------------------------------------


def _is_pool(t: Any, pool: PoolKey) -> list[Any]:
    return [t.c[name] == value for name, value in zip(POOL_COLUMNS, pool, strict=True)]


def _raw_select(pool: PoolKey) -> Select[Any]:
    t = _RAW
    return select(
        t.c.observed_at.label("at"),
        t.c.usd_per_hour.label("usd"),
        t.c.usd_per_hour.label("lo"),
        t.c.usd_per_hour.label("hi"),
        literal_column("1").label("n"),
        literal_column(f"'{Tier.RAW.value}'").label("tier"),
    ).where(*_is_pool(t, pool))


def _hourly_select(pool: PoolKey) -> Select[Any]:
    t = _HOURLY
    return select(
        t.c.hour.label("at"),
        t.c.median_usd.label("usd"),
        t.c.min_usd.label("lo"),
        t.c.max_usd.label("hi"),
        t.c.points.label("n"),
        literal_column(f"'{Tier.HOURLY.value}'").label("tier"),
    ).where(*_is_pool(t, pool))


def points_in_effect(
    conn: Connection,
    pool: PoolKey,
    since: datetime | None,
    until: datetime | None,
    *,
    prior: bool,
    limit: int | None,
) -> list[PricePoint]:
    """The pool's points with since <= at < until across both tiers, oldest first; with
    `prior`, first the last point before `since` (the price in effect at `since` when no
    point falls on it). `limit` keeps the oldest `limit` points of the range (the prior
    point does not count). One round trip; every part is a range on a (pool, time) index."""
    raw_time, hourly_time = _RAW.c.observed_at, _HOURLY.c.hour
    parts: list[Select[Any]] = []
    if prior and since is not None:
        parts.append(
            _raw_select(pool)
            .where(raw_time < since)
            .order_by(raw_time.desc(), _RAW.c.id.desc())
            .limit(1)
        )
        parts.append(
            _hourly_select(pool).where(hourly_time < since).order_by(hourly_time.desc()).limit(1)
        )
    raw, hourly = _raw_select(pool), _hourly_select(pool)
    if since is not None:
        raw, hourly = raw.where(raw_time >= since), hourly.where(hourly_time >= since)
    if until is not None:
        raw, hourly = raw.where(raw_time < until), hourly.where(hourly_time < until)
    raw, hourly = raw.order_by(raw_time, _RAW.c.id), hourly.order_by(hourly_time)
    if limit is not None:
        raw, hourly = raw.limit(limit), hourly.limit(limit)
    parts += [raw, hourly]
    query = union_all(*(select(part.subquery()) for part in parts))
    rows = [
        PricePoint(row.at, row.usd, Tier(row.tier), row.lo, row.hi, int(row.n))
        for row in conn.execute(query)
    ]
    before: list[PricePoint] = []
    if prior and since is not None:
        # The first rows are the priors (at < since); the later of the two is in effect.
        before = [p for p in rows if p.at < since]
        rows = [p for p in rows if p.at >= since]
        if before:
            before = [max(before, key=lambda p: (p.at, p.tier is Tier.RAW))]
    # Hourly rows sort before raw points of the same instant (a late point merged later).
    rows.sort(key=lambda p: (p.at, p.tier is Tier.RAW))
    if limit is not None:
        rows = rows[:limit]
    return before + rows


# -- pruning ---------------------------------------------------------------------------------


def _next_pool(conn: Connection, after: PoolKey | None) -> PoolKey | None:
    """The first pool after `after` (in the database's own key order) that has raw points or
    hourly rows; seeks on both tables' (pool, time) indexes."""
    parts = []
    for t in (_RAW, _HOURLY):
        cols = [t.c[name] for name in POOL_COLUMNS]
        part = select(*cols).order_by(*cols).limit(1)
        if after is not None:
            part = part.where(tuple_(*cols) > tuple_(*(literal(v) for v in after)))
        parts.append(part)
    both = union_all(*(select(part.subquery()) for part in parts)).subquery()
    keys = [both.c[name] for name in POOL_COLUMNS]
    row = conn.execute(select(*keys).order_by(*keys).limit(1)).first()
    return None if row is None else (row[0], row[1], row[2], row[3], row[4])


@dataclass
class _PoolWork:
    used: int = 0
    summarized: int = 0
    hours: int = 0
    dropped: int = 0
    expired: int = 0
    finished: bool = True


def _upsert_hours(conn: Connection, dialect: str, pool: PoolKey, hours: list[HourSummary]) -> None:
    stmt = dialect_insert(dialect, _HOURLY)
    stmt = stmt.on_conflict_do_update(
        index_elements=[*POOL_COLUMNS, "hour"],
        set_={name: stmt.excluded[name] for name in ("min_usd", "median_usd", "max_usd", "points")},
    )
    keys = dict(zip(POOL_COLUMNS, pool, strict=True))
    conn.execute(
        stmt,
        [
            {
                **keys,
                "hour": h.hour,
                "min_usd": h.min_usd,
                "median_usd": h.median_usd,
                "max_usd": h.max_usd,
                "points": h.points,
            }
            for h in hours
        ],
    )


def _summarize_raw(
    conn: Connection,
    dialect: str,
    pool: PoolKey,
    retention: Retention,
    now: datetime,
    budget: int,
    fresh: bool,
    work: _PoolWork,
) -> None:
    """Move the pool's raw points of whole hours past the raw retention into hourly rows,
    at most `budget` points (more only when one hour alone holds more and the batch is
    `fresh`, so every batch makes progress)."""
    t, when = _RAW, _RAW.c.observed_at
    cutoff = retention.raw_cutoff(now)
    old = select(when).where(*_is_pool(t, pool), when < cutoff).order_by(when, t.c.id)
    first = conn.execute(old.limit(1)).scalar()
    if first is None:
        return
    over = conn.execute(old.offset(budget).limit(1)).scalar()
    end = cutoff
    if over is not None:
        work.finished = False
        end = floor_hour(over)
        if end <= floor_hour(first):
            if not fresh:
                return  # the next batch starts with this pool and a whole budget
            end = floor_hour(first) + HOUR
    removed = conn.execute(
        delete(t).where(*_is_pool(t, pool), when < end).returning(when, t.c.usd_per_hour)
    ).all()
    work.used += len(removed)
    floor = retention.hourly_cutoff(now)
    kept = [(at, usd) for at, usd in removed if at >= floor]
    work.dropped += len(removed) - len(kept)
    work.summarized += len(kept)
    summaries = summarize(kept)
    if not summaries:
        return
    h = _HOURLY
    held_rows = conn.execute(
        select(h.c.hour, h.c.min_usd, h.c.median_usd, h.c.max_usd, h.c.points)
        .where(*_is_pool(h, pool), h.c.hour >= summaries[0].hour, h.c.hour <= summaries[-1].hour)
        .with_for_update()
    ).all()
    if held_rows:
        held = {r.hour: HourSummary(*r) for r in held_rows}
        by_hour: dict[datetime, list[float]] = {}
        for at, usd in kept:
            by_hour.setdefault(floor_hour(at), []).append(usd)
        summaries = [
            merge(held[s.hour], s, by_hour[s.hour]) if s.hour in held else s for s in summaries
        ]
    _upsert_hours(conn, dialect, pool, summaries)
    work.hours += len(summaries)


def _expire_hourly(
    conn: Connection,
    pool: PoolKey,
    retention: Retention,
    now: datetime,
    budget: int,
    work: _PoolWork,
) -> None:
    """Remove the pool's hourly rows past the hourly retention, at most `budget`."""
    h = _HOURLY
    expired = select(h.c.id).where(*_is_pool(h, pool), h.c.hour < retention.hourly_cutoff(now))
    if conn.execute(expired.limit(1)).first() is None:
        return  # nothing to do: no write, so no write lock on SQLite
    if budget <= 0:
        work.finished = False
        return
    ids = expired.order_by(h.c.hour).limit(budget).scalar_subquery()
    count = conn.execute(delete(h).where(h.c.id.in_(ids))).rowcount
    work.used += count
    work.expired += count
    if count >= budget:
        work.finished = False  # maybe more; the next batch looks again


def prune_batch(
    conn: Connection,
    dialect: str,
    retention: Retention,
    now: datetime,
    *,
    after: PoolKey | None,
    max_rows: int,
    max_pools: int,
) -> PruneBatch:
    """One batch on `conn` (the caller's transaction): the pools after `after`, in key order,
    until about `max_rows` rows were removed or `max_pools` pools were visited."""
    if max_rows < 1 or max_pools < 1:
        raise ValueError("max_rows and max_pools must be at least 1")
    totals = _PoolWork()
    budget, visited, cursor, done = max_rows, 0, after, False
    while visited < max_pools and budget > 0:
        pool = _next_pool(conn, cursor)
        if pool is None:
            done = True
            break
        visited += 1
        work = _PoolWork()
        _summarize_raw(conn, dialect, pool, retention, now, budget, budget == max_rows, work)
        if work.finished:
            _expire_hourly(conn, pool, retention, now, budget - work.used, work)
        budget -= work.used
        totals.summarized += work.summarized
        totals.hours += work.hours
        totals.dropped += work.dropped
        totals.expired += work.expired
        if not work.finished:
            break  # the next batch takes this pool up again
        cursor = pool
    return PruneBatch(
        pools=visited,
        summarized=totals.summarized,
        hours=totals.hours,
        dropped=totals.dropped,
        expired=totals.expired,
        after=cursor,
        done=done,
    )
