"""Price history read in fixed time buckets, for charts that must stay small whatever the
store keeps.

A `Grid` cuts a window into at most a given number of equal buckets, each a whole number of
seconds wide and aligned on multiples of its width since the epoch (so hourly buckets start
on the hour, where the hourly tier's rows do). For one pool, the database reduces the points
of each bucket, across both tiers as `history.points_in_effect` reads them, to one row: the
lowest price among them, how many whole seconds into the bucket the first of them falls, and
the last one's price. Each part of the query is a range or a seek on a (pool, time) index,
and what comes back is at most one row per bucket plus the price in effect before the grid,
however many points the window holds.

`fill` turns those rows into what a step chart needs per bucket (`InEffect`): the lowest
price in effect at any moment of the bucket (the price carried in from before it counts
until the bucket's first point, unless that point falls in the bucket's first second) and
the price in effect at its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Select,
    bindparam,
    case,
    cast,
    func,
    select,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement

from optimizer.store.engine import table
from optimizer.store.history import PoolKey
from optimizer.store.tables import POOL_COLUMNS, PriceHistory, PriceHourly

_RAW = table(PriceHistory)
_HOURLY = table(PriceHourly)

# Bucket widths a grid picks from, in seconds: the narrowest that keeps the window within
# the bucket limit (1, 2, 5, 10, 15, 30 minutes; 1, 2, 3, 6, 12 hours; 1 day; then days).
WIDTHS_S: tuple[int, ...] = (
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
)
PRIOR = -1  # the bucket index of the last point before the grid


@dataclass(frozen=True, slots=True)
class Grid:
    """`count` buckets of `width_s` seconds from `origin` (a whole second, UTC)."""

    origin: datetime
    width_s: int
    count: int

    @classmethod
    def over(cls, since: datetime, until: datetime, max_buckets: int) -> Grid:
        """The narrowest aligned grid from the bucket holding `since` through the one
        holding `until` with at most `max_buckets` buckets."""
        if max_buckets < 2:
            raise ValueError("max_buckets must be at least 2")
        if until <= since:
            raise ValueError("until must be later than since")
        start, end = int(since.timestamp()), int(until.timestamp())
        span = end - start
        width = next((w for w in WIDTHS_S if span // w + 2 <= max_buckets), None)
        if width is None:  # whole days
            days = 2
            while span // (days * 86400) + 2 > max_buckets:
                days += 1
            width = days * 86400
        first = start - start % width
        count = (end - first) // width + 1
        return cls(datetime.fromtimestamp(first, UTC), width, count)

    @property
    def width(self) -> timedelta:
        return timedelta(seconds=self.width_s)

    @property
    def until(self) -> datetime:
        """The end of the last bucket."""
        return self.start(self.count)

    def start(self, index: int) -> datetime:
        return self.origin + index * self.width


@dataclass(frozen=True, slots=True)
class BucketRow:
    """One bucket's points as the database reduces them: `first_s`, the whole seconds from
    the bucket's start to its first point (`index` PRIOR: the last point before the grid,
    where only `last` counts)."""

    index: int
    first_s: int
    low: float
    last: float


@dataclass(frozen=True, slots=True)
class InEffect:
    """A pool's prices over one bucket: the lowest in effect at any moment of it, and the
    one in effect at its end."""

    low: float
    end: float


def fill(rows: Sequence[BucketRow], grid: Grid) -> list[InEffect | None]:
    """Per bucket of `grid`, the prices in effect over it (None while no point is in effect
    yet): a bucket without points holds the price carried in from before it. The carried
    price counts in a bucket's lowest unless its first point falls in the bucket's first
    second (seconds are whole in the database's reduction; buckets are a minute or more)."""
    by_index = {row.index: row for row in rows}
    prior = by_index.get(PRIOR)
    carry = prior.last if prior is not None else None
    held = None if carry is None else InEffect(carry, carry)
    out: list[InEffect | None] = []
    for index in range(grid.count):
        row = by_index.get(index)
        if row is None:
            out.append(held)
            continue
        low = row.low
        if carry is not None and row.first_s > 0 and carry < low:
            low = carry  # the carried price held until the bucket's first point
        carry = row.last
        held = InEffect(carry, carry)
        out.append(InEffect(low, carry))
    return out


# -- the query -------------------------------------------------------------------------------


def _is_pool(t: Any) -> list[ColumnElement[bool]]:
    return [t.c[name] == bindparam(f"pool_{name}") for name in POOL_COLUMNS]


def _epoch_s(dialect: str, at: Any) -> ColumnElement[Any]:
    """Whole seconds since the epoch, rounded down: exact, so a point on a bucket's edge
    falls in the bucket it starts."""
    if dialect == "sqlite":  # naive UTC text; '%s' drops the fraction
        return cast(func.strftime("%s", at), BigInteger)
    return cast(func.floor(func.extract("epoch", at)), BigInteger)


def _tier(t: Any, time: Any, price: Any) -> Select[Any]:
    return select(time.label("at"), price.label("usd")).where(*_is_pool(t))


def _last_price(t: Any, time: Any, price: Any, at: Any) -> Any:
    """The price of the pool's last entry at `at` on one tier (an index seek)."""
    return (
        select(price).where(*_is_pool(t), time == at).order_by(t.c.id.desc()).limit(1)
    ).scalar_subquery()


@cache
def _bucket_query(dialect: str) -> Select[Any]:
    """For one pool: the last point before `origin` (on either tier; the later one is in
    effect) as bucket PRIOR, then per bucket of the points in [origin, until) the lowest
    price, the first instant and the last point's price.

    One pass over the window's points, grouped (window functions cost SQLite three times
    as much); the last point's price is then one seek per bucket at its last instant: the
    raw point written last there, else the hourly row (a raw point sorts after an hourly
    row of the same instant, as history.py reads them)."""
    tiers = (
        (_RAW, _RAW.c.observed_at, _RAW.c.usd_per_hour),
        (_HOURLY, _HOURLY.c.hour, _HOURLY.c.median_usd),
    )
    parts: list[Select[Any]] = []
    for t, time, price in tiers:
        before = _tier(t, time, price).where(time < bindparam("origin"))
        parts.append(before.order_by(time.desc()).limit(1))
        parts.append(
            _tier(t, time, price).where(time >= bindparam("origin"), time < bindparam("until"))
        )
    points = union_all(*(select(part.subquery()) for part in parts)).subquery()
    offset = _epoch_s(dialect, points.c.at) - bindparam("origin_s", type_=BigInteger)
    width = bindparam("width_s", type_=BigInteger)
    index = case((points.c.at < bindparam("origin"), PRIOR), else_=offset // width)
    indexed = select(points.c.at, points.c.usd, index.label("b"), offset.label("s")).subquery()
    grouped = (
        select(
            indexed.c.b,
            (func.min(indexed.c.s) - indexed.c.b * width).label("first_s"),
            func.min(indexed.c.usd).label("low"),
            func.max(indexed.c.at).label("last_at"),
        )
        .group_by(indexed.c.b)
        .subquery()
    )
    last = func.coalesce(*(_last_price(*tier, grouped.c.last_at) for tier in tiers))
    return select(grouped.c.b, grouped.c.first_s, grouped.c.low, last).order_by(grouped.c.b)


def bucket_rows(conn: Connection, dialect: str, pool: PoolKey, grid: Grid) -> list[BucketRow]:
    """One pool's points over `grid`, one row per bucket that has any (and PRIOR first when
    a point precedes the grid); one round trip."""
    params: dict[str, Any] = {f"pool_{n}": v for n, v in zip(POOL_COLUMNS, pool, strict=True)}
    params.update(
        origin=grid.origin,
        until=grid.until,
        origin_s=int(grid.origin.timestamp()),
        width_s=grid.width_s,
    )
    rows = conn.execute(_bucket_query(dialect), params).all()
    return [BucketRow(int(b), int(first), float(low), float(last)) for b, first, low, last in rows]
