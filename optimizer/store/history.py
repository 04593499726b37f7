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
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    Select,
    bindparam,
    delete,
    exists,
    func,
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
"""A pool as the store's rows key it: (provider, region, zone or '', instance type, market).
Above the store a pool is `optimizer.model.Pool` (zone None when regional); this row form
stays inside the store, where '' keeps unique keys working (tables.py says why)."""


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
    if at.tzinfo is not UTC:
        at = at.astimezone(UTC)
    return at.replace(minute=0, second=0, microsecond=0)


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
#
# Statements are built once per shape with bound parameters: building a SQLAlchemy statement
# costs more than running this one on an index, and the ledger reads once per attempt.


def _is_pool(t: Any) -> list[Any]:
    return [t.c[name] == bindparam(f"pool_{name}") for name in POOL_COLUMNS]


def _pool_params(pool: PoolKey) -> dict[str, str]:
    return {f"pool_{name}": value for name, value in zip(POOL_COLUMNS, pool, strict=True)}


def _raw_select() -> Select[Any]:
    t = _RAW
    return select(
        t.c.observed_at.label("at"),
        t.c.usd_per_hour.label("usd"),
        t.c.usd_per_hour.label("lo"),
        t.c.usd_per_hour.label("hi"),
        literal_column("1").label("n"),
        literal_column(f"'{Tier.RAW.value}'").label("tier"),
        literal_column("1").label("rank"),  # after an hourly row of the same instant
        t.c.id.label("seq"),
    ).where(*_is_pool(t))


def _hourly_select() -> Select[Any]:
    t = _HOURLY
    return select(
        t.c.hour.label("at"),
        t.c.median_usd.label("usd"),
        t.c.min_usd.label("lo"),
        t.c.max_usd.label("hi"),
        t.c.points.label("n"),
        literal_column(f"'{Tier.HOURLY.value}'").label("tier"),
        literal_column("0").label("rank"),
        t.c.id.label("seq"),
    ).where(*_is_pool(t))


@cache
def _points_query(prior: bool, since: bool, until: bool, limit: bool) -> Select[Any]:
    """The union of up to four index ranges: with `prior`, the last raw point and the last
    hourly row before `since`; then the raw points and hourly rows in the window."""
    raw_time, hourly_time = _RAW.c.observed_at, _HOURLY.c.hour
    parts: list[Select[Any]] = []
    if prior:
        parts.append(
            _raw_select()
            .where(raw_time < bindparam("since"))
            .order_by(raw_time.desc(), _RAW.c.id.desc())
            .limit(1)
        )
        parts.append(
            _hourly_select()
            .where(hourly_time < bindparam("since"))
            .order_by(hourly_time.desc())
            .limit(1)
        )
    raw, hourly = _raw_select(), _hourly_select()
    if since:
        raw = raw.where(raw_time >= bindparam("since"))
        hourly = hourly.where(hourly_time >= bindparam("since"))
    if until:
        raw = raw.where(raw_time < bindparam("until"))
        hourly = hourly.where(hourly_time < bindparam("until"))
    raw, hourly = raw.order_by(raw_time, _RAW.c.id), hourly.order_by(hourly_time)
    if limit:
        raw, hourly = raw.limit(bindparam("limit")), hourly.limit(bindparam("limit"))
    parts += [raw, hourly]
    both = union_all(*(select(part.subquery()) for part in parts)).subquery()
    return select(both).order_by(both.c.at, both.c.rank, both.c.seq)


_TIERS = {tier.value: tier for tier in Tier}
PointRow = Row[datetime, float, float, float, int, str, int, int]
"""A point as read: at, usd_per_hour, min, max, points, tier, then the sort keys."""


def points_in_effect(
    conn: Connection,
    pool: PoolKey,
    since: datetime | None,
    until: datetime | None,
    *,
    prior: bool,
    limit: int | None,
) -> list[PointRow]:
    """The pool's points with since <= at < until across both tiers, oldest first, as rows
    (at, usd, lo, hi, n, tier, rank, seq); with `prior`, first the last point before `since`
    (the price in effect at `since` when no point falls on it). `limit` keeps the oldest
    `limit` points of the range (the prior point does not count). One round trip; every part
    is a range on a (pool, time) index, the few rows sorted by the database."""
    prior = prior and since is not None
    query = _points_query(prior, since is not None, until is not None, limit is not None)
    params: dict[str, Any] = _pool_params(pool)
    params.update(since=since, until=until, limit=limit)
    rows: Sequence[PointRow] = conn.execute(query, params).all()
    first = 0  # where the window's points begin
    if prior and since is not None:
        while first < len(rows) and rows[first][0] < since:
            first += 1
    # Up to two priors (the last raw point, the last hourly row) sort first: the later one
    # is in effect at since.
    head = rows[max(first - 1, 0) : first]
    body = rows[first:] if limit is None else rows[first : first + limit]
    return [*head, *body]


def price_point(row: PointRow) -> PricePoint:
    at, usd, lo, hi, n, tier = row[:6]
    return PricePoint(at, usd, _TIERS[tier], lo, hi, int(n))


# -- pruning ---------------------------------------------------------------------------------


@cache
def _next_pool_query(first: bool) -> Select[Any]:
    parts = []
    for t, time in ((_RAW, _RAW.c.observed_at), (_HOURLY, _HOURLY.c.hour)):
        cols = [t.c[name] for name in POOL_COLUMNS]
        part = select(*cols).order_by(*cols, time).limit(1)
        if not first:
            # Past the pool's last entry, on the whole index key: comparing the pool columns
            # alone would step over every entry of the pool one by one. No entry: NULL, and
            # the pool columns decide.
            last = select(func.max(time)).where(*_is_pool(t)).scalar_subquery()
            # Named apart from pool_*: PostgreSQL deduces one type per parameter, and the
            # row comparison would deduce another than the column comparisons.
            after = tuple_(*(bindparam(f"after_{name}") for name in POOL_COLUMNS), last)
            part = part.where(tuple_(*cols, time) > after)
        parts.append(part)
    both = union_all(*(select(part.subquery()) for part in parts)).subquery()
    keys = [both.c[name] for name in POOL_COLUMNS]
    return select(*keys).order_by(*keys).limit(1)


def _next_pool(conn: Connection, after: PoolKey | None) -> PoolKey | None:
    """The first pool after `after` (in the database's own key order) that has raw points or
    hourly rows; seeks on both tables' (pool, time) indexes."""
    params: dict[str, str] = {}
    if after is not None:
        params = _pool_params(after)
        params.update({f"after_{n}": v for n, v in zip(POOL_COLUMNS, after, strict=True)})
    row = conn.execute(_next_pool_query(after is None), params).first()
    return None if row is None else (row[0], row[1], row[2], row[3], row[4])


# The pool's raw points before `cutoff`, oldest first: the first, and the one at `offset`.
_OLD_RAW = (
    select(_RAW.c.observed_at)
    .where(*_is_pool(_RAW), _RAW.c.observed_at < bindparam("cutoff"))
    .order_by(_RAW.c.observed_at, _RAW.c.id)
    .limit(1)
)
_EXPIRED = select(_HOURLY.c.id).where(*_is_pool(_HOURLY), _HOURLY.c.hour < bindparam("floor"))
# What a pool needs, in one round trip: its oldest raw point past the raw retention, the one
# `offset` points later (where a batch's budget ends), and whether hourly rows expired.
_PROBE = select(
    _OLD_RAW.scalar_subquery().label("first"),
    _OLD_RAW.offset(bindparam("offset")).scalar_subquery().label("over"),
    exists(_EXPIRED).label("expired"),
)
_TAKE_RAW = (
    delete(_RAW)
    .where(*_is_pool(_RAW), _RAW.c.observed_at < bindparam("end"))
    .returning(_RAW.c.observed_at, _RAW.c.usd_per_hour)
)
_HELD_HOURS = (
    select(_HOURLY.c.hour, _HOURLY.c.min_usd, _HOURLY.c.median_usd, _HOURLY.c.max_usd)
    .add_columns(_HOURLY.c.points)
    .where(
        *_is_pool(_HOURLY),
        _HOURLY.c.hour >= bindparam("first"),
        _HOURLY.c.hour <= bindparam("last"),
    )
    .with_for_update()
)
_DROP_EXPIRED = delete(_HOURLY).where(
    _HOURLY.c.id.in_(_EXPIRED.order_by(_HOURLY.c.hour).limit(bindparam("budget")).scalar_subquery())
)


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
    span: tuple[datetime, datetime | None],
    fresh: bool,
    work: _PoolWork,
) -> None:
    """Move the pool's raw points of whole hours past the raw retention into hourly rows:
    `span` is the first such point and the one where the batch's budget ends (None: all
    fit). More than the budget only when one hour alone holds more and the batch is
    `fresh`, so every batch makes progress."""
    keys = _pool_params(pool)
    first, over = span
    end = retention.raw_cutoff(now)
    if over is not None:
        work.finished = False
        end = floor_hour(over)
        if end <= floor_hour(first):
            if not fresh:
                return  # the next batch starts with this pool and a whole budget
            end = floor_hour(first) + HOUR
    removed = conn.execute(_TAKE_RAW, {**keys, "end": end}).all()
    work.used += len(removed)
    floor = retention.hourly_cutoff(now)
    kept = [(at, usd) for at, usd in removed if at >= floor]
    work.dropped += len(removed) - len(kept)
    work.summarized += len(kept)
    summaries = summarize(kept)
    if not summaries:
        return
    held_rows = conn.execute(
        _HELD_HOURS, {**keys, "first": summaries[0].hour, "last": summaries[-1].hour}
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
    """Remove the pool's hourly rows past the hourly retention, at most `budget` (the
    probe found some)."""
    params = {**_pool_params(pool), "floor": retention.hourly_cutoff(now)}
    if budget <= 0:
        work.finished = False
        return
    count = conn.execute(_DROP_EXPIRED, {**params, "budget": budget}).rowcount
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
        probe = conn.execute(
            _PROBE,
            {
                **_pool_params(pool),
                "cutoff": retention.raw_cutoff(now),
                "offset": budget,
                "floor": retention.hourly_cutoff(now),
            },
        ).one()
        # A pool with nothing to do costs this one read: no write, so no write lock on SQLite.
        if probe.first is not None:
            span = (probe.first, probe.over)
            _summarize_raw(conn, dialect, pool, retention, now, span, budget == max_rows, work)
        if work.finished and probe.expired:
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
