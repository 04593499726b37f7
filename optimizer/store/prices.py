"""The prices repository: price history, each pool's latest price, and the providers' spec cache.

Price history has two tiers, raw points and hourly summaries; `history.py` holds how they
are read together and how points age from one to the next (`prune_history`).

Bulk paths use SQLAlchemy Core over plain dicts (executemany), because building ORM objects
costs more than the insert itself; every write is one transaction.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Insert, Row, delete, func, insert, select

from optimizer.model import OFFER_FIELDS, Market, Offer, Pool
from optimizer.store import buckets, history
from optimizer.store.buckets import Grid, InEffect
from optimizer.store.engine import Database, aware, chunks, dialect_insert, table
from optimizer.store.history import PointRow, PoolKey, PricePoint, PruneBatch, Retention
from optimizer.store.tables import POOL_COLUMNS, LatestPrice, PriceHistory, SpecCacheEntry

if TYPE_CHECKING:  # bulk.py brings numpy, which only backtests need
    from optimizer.store.bulk import PriceColumns

# The Offer fields the latest_price table keeps: a commitment's terms are not among them,
# because committed offers stay out of the store (`Prices.record_offers`).
STORED_FIELDS: tuple[str, ...] = tuple(
    name for name in OFFER_FIELDS if name in LatestPrice.model_fields
)

# Rows per executemany call: big enough to amortize the round trip, small enough that one
# chunk's parameter list stays a few MB.
CHUNK_ROWS = 5_000

_HISTORY = table(PriceHistory)
_LATEST = table(LatestPrice)
_SPEC = table(SpecCacheEntry)


def _history_row(offer: Offer) -> dict[str, Any]:
    return {
        "provider": offer.provider,
        "region": offer.region,
        "zone": offer.zone or "",
        "instance_type": offer.instance_type,
        "market": offer.market.value,
        "usd_per_hour": offer.usd_per_hour,
        "observed_at": offer.observed_at,
        "source": offer.source,
    }


def _latest_row(offer: Offer) -> dict[str, Any]:
    row = {name: getattr(offer, name) for name in STORED_FIELDS}
    row["zone"] = offer.zone or ""
    row["market"] = offer.market.value
    row["interconnect"] = offer.interconnect.value
    row["fabric"] = offer.fabric.value
    return row


# How many writes `changed_providers` can walk back through.
_WRITES_KEPT = 64


OffersVersion = tuple[int, int]
"""What the latest offers were at (`Prices.offers_version`): the newest price history row in
the database, and how many writes this process has made."""

WriteWatcher = Callable[[OffersVersion, OffersVersion, tuple[Offer, ...]], None]
"""What `Prices.watch_writes` calls after each write: before, after, the offers written."""


def _offer(row: Row[Any]) -> Offer:
    values = row._mapping
    fields = {name: values[name] for name in STORED_FIELDS}
    fields["zone"] = fields["zone"] or None
    return Offer(**fields)


def _upsert_latest(dialect: str) -> Insert:
    """INSERT … ON CONFLICT (pool) DO UPDATE, only when the incoming row is not older."""
    stmt = dialect_insert(dialect, _LATEST)
    excluded = stmt.excluded
    updates = {name: excluded[name] for name in STORED_FIELDS if name not in POOL_COLUMNS}
    return stmt.on_conflict_do_update(
        index_elements=list(POOL_COLUMNS),
        set_=updates,
        where=excluded.observed_at >= _LATEST.c.observed_at,
    )


class Prices:
    """Offers in, latest offers and one pool's history out; the spec cache
    (providers.base.SpecCache) the AWS and GCP adapters keep specs and list prices in."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._upsert = _upsert_latest(db.dialect)
        # Writes are one at a time in a process, so each one's versions before and after
        # are exact (a PostgreSQL sequence hands out ids before the commits that show them).
        self._write_lock = threading.Lock()
        self._writes_made = 0
        self._writes: deque[tuple[OffersVersion, OffersVersion, frozenset[str]]] = deque(
            maxlen=_WRITES_KEPT
        )
        self._watchers: list[weakref.WeakMethod[WriteWatcher]] = []

    def record_offers(self, offers: Iterable[Offer]) -> int:
        """Append offers to price history and advance each pool's latest price; one transaction.

        A pool's latest row only moves forward: an observation older than the stored one is
        kept in history but does not replace it. Committed offers (a commitment's rate, fixed
        for its term, several terms per pool) are not prices in effect and are left out.
        Returns the number of history rows written.
        """
        offers = (offer for offer in offers if offer.market is not Market.COMMITTED)
        newest: dict[Pool, Offer] = {}
        written = 0
        with self._write_lock:
            with self._db.begin() as conn:
                before = (self._newest_history_id(conn), self._writes_made)
                for chunk in chunks(offers, CHUNK_ROWS):
                    conn.execute(insert(_HISTORY), [_history_row(offer) for offer in chunk])
                    written += len(chunk)
                    for offer in chunk:
                        # One row per pool per statement: PostgreSQL refuses to upsert a row
                        # twice in one command, and it saves work on both engines.
                        held = newest.get(offer.pool)
                        if held is None or offer.observed_at >= held.observed_at:
                            newest[offer.pool] = offer
                for rows in chunks(map(_latest_row, newest.values()), CHUNK_ROWS):
                    conn.execute(self._upsert, rows)
                after_id = self._newest_history_id(conn)
            if written:
                self._writes_made += 1
                after = (after_id, self._writes_made)
                self._writes.append((before, after, frozenset(p for p, *_ in newest)))
                for ref in list(self._watchers):
                    watcher = ref()
                    if watcher is None:
                        self._watchers.remove(ref)
                    else:
                        watcher(before, after, tuple(newest.values()))
        return written

    def record_history(self, points: Iterable[tuple[Pool, float, datetime, str]]) -> int:
        """Append past prices to the history alone, one transaction: (pool, USD/h, observed
        at, source) each. The latest prices stay the polls' (a backfill of the local cloud's
        simulated past, providers/local/history.py). Returns the rows written."""
        written = 0
        with self._write_lock, self._db.begin() as conn:
            for chunk in chunks(points, CHUNK_ROWS):
                conn.execute(
                    insert(_HISTORY),
                    [
                        {
                            "provider": pool[0],
                            "region": pool[1],
                            "zone": pool[2] or "",
                            "instance_type": pool[3],
                            "market": str(pool[4]),
                            "usd_per_hour": usd,
                            "observed_at": at,
                            "source": source,
                        }
                        for pool, usd, at, source in chunk
                    ],
                )
                written += len(chunk)
        return written

    def watch_writes(self, watcher: WriteWatcher) -> None:
        """Call the bound method `watcher(before, after, offers)` after each of this process's
        writes, in order, with the versions around it and the newest offer it wrote per pool
        (a pool's latest row takes it where it is not older than the row's). Held weakly: a
        watcher's object can go."""
        with self._write_lock:
            self._watchers.append(weakref.WeakMethod(watcher))

    @staticmethod
    def _newest_history_id(conn: Any) -> int:
        return int(conn.execute(select(func.max(_HISTORY.c.id))).scalar() or 0)

    def offers_version(self) -> OffersVersion:
        """A value that changes whenever the latest offers may have: the newest price history
        row (every write adds rows, this process's or another replica's) and this process's
        count of writes (SQLite may hand out an id again after a prune). Read it before the
        offers it stands for: offers newer than their version are read again, never missed."""
        with self._db.connect() as conn:
            return (self._newest_history_id(conn), self._writes_made)

    def changed_providers(self, since: OffersVersion, now: OffersVersion) -> frozenset[str] | None:
        """The providers whose latest offers this process's writes changed between two
        versions, or None where something else may have changed them too (another replica's
        write, a write older than those kept): then read them all."""
        changed: set[str] = set()
        at = since
        for before, after, providers in list(self._writes):
            if at == now:
                break
            if before == at:
                changed |= providers
                at = after
        return frozenset(changed) if at == now else None

    def latest_offers(
        self,
        *,
        provider: str | None = None,
        region: str | None = None,
        market: Market | str | None = None,
    ) -> list[Offer]:
        """The newest offer of every pool, optionally filtered, ordered by pool."""
        query = select(_LATEST).order_by(*(_LATEST.c[name] for name in POOL_COLUMNS))
        if provider is not None:
            query = query.where(_LATEST.c.provider == provider)
        if region is not None:
            query = query.where(_LATEST.c.region == region)
        if market is not None:
            query = query.where(_LATEST.c.market == Market(market).value)
        with self._db.connect() as conn:
            return [_offer(row) for row in conn.execute(query)]

    def history_columns(
        self, since: datetime | None = None, until: datetime | None = None
    ) -> PriceColumns:
        """Every price point with since <= at <= until (whole seconds) of the pools the store
        lists, across both tiers, as columns in time order: raw points, and each hourly row
        as its median from the start of its hour (`bulk.py` says how it is read)."""
        start = None if since is None else aware(since, "since")
        end = None if until is None else aware(until, "until")
        from optimizer.store import bulk

        with self._db.connect() as conn:
            return bulk.price_columns(conn, start, end)

    def cheapest_offers(
        self,
        *,
        provider: str | None = None,
        region: str | None = None,
        market: Market | str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[int, list[Offer]]:
        """One page of the latest offers, cheapest first (ties in pool order), optionally
        filtered, and how many match in all."""
        where = []
        if provider is not None:
            where.append(_LATEST.c.provider == provider)
        if region is not None:
            where.append(_LATEST.c.region == region)
        if market is not None:
            where.append(_LATEST.c.market == Market(market).value)
        order = (_LATEST.c.usd_per_hour, *(_LATEST.c[name] for name in POOL_COLUMNS))
        page = select(_LATEST).where(*where).order_by(*order).limit(limit).offset(offset)
        with self._db.connect() as conn:
            total = conn.execute(select(func.count()).select_from(_LATEST).where(*where)).scalar()
            return int(total or 0), [_offer(row) for row in conn.execute(page)]

    def earliest_observation(self, provider: str) -> datetime | None:
        """When the store's oldest price of `provider` was observed (raw points, or the hourly
        summaries retention left of older ones); None when it has none."""
        from optimizer.store.tables import PriceHourly

        hourly = table(PriceHourly)
        with self._db.connect() as conn:
            found = [
                conn.execute(
                    select(column).where(source.c.provider == provider).order_by(column).limit(1)
                ).scalar()
                for source, column in ((_HISTORY, _HISTORY.c.observed_at), (hourly, hourly.c.hour))
            ]
        times = [aware(t, "observed_at") for t in found if t is not None]
        return min(times) if times else None

    def offer_counts(self) -> dict[tuple[str, str], int]:
        """Latest offers per (provider, market)."""
        query = select(_LATEST.c.provider, _LATEST.c.market, func.count()).group_by(
            _LATEST.c.provider, _LATEST.c.market
        )
        with self._db.connect() as conn:
            return {(p, m): int(n) for p, m, n in conn.execute(query)}

    def price_history(
        self,
        provider: str,
        region: str,
        zone: str | None,
        instance_type: str,
        market: Market | str,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        prior: bool = False,
    ) -> list[tuple[datetime, float]]:
        """One pool's prices in effect, (at, usd_per_hour) oldest first, for since <= at <
        until, across both tiers (`price_points` says how); with `prior`, first the last
        point before `since` (the price in effect at `since`). What the ledger integrates."""
        rows = self._points(
            provider, region, zone, instance_type, market, since, until, prior, None
        )
        return [(row[0], row[1]) for row in rows]

    def price_points(
        self,
        provider: str,
        region: str,
        zone: str | None,
        instance_type: str,
        market: Market | str,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        prior: bool = False,
        limit: int | None = None,
    ) -> list[PricePoint]:
        """One pool's points in effect over [since, until), oldest first: raw points where
        they are kept, and for older hours each hour's summary, in effect from the start of
        the hour at its median. With `prior`, first the last point before `since`; `limit`
        keeps the oldest `limit` points of the range (the prior one aside)."""
        rows = self._points(
            provider, region, zone, instance_type, market, since, until, prior, limit
        )
        return [history.price_point(row) for row in rows]

    def price_histories(
        self,
        windows: Sequence[tuple[tuple[str, str, str | None, str, str], datetime, datetime]],
        *,
        prior: bool = False,
    ) -> list[list[tuple[datetime, float]]]:
        """`price_history` for many (pool, since, until) windows, in order, on one connection
        (the ledger prices every live attempt's pools at once; a checkout per pool cost a
        round trip each on PostgreSQL)."""
        out: list[list[tuple[datetime, float]]] = []
        with self._db.connect() as conn:
            for (provider, region, zone, instance_type, market), since, until in windows:
                pool = (provider, region, zone or "", instance_type, Market(market).value)
                rows = history.points_in_effect(
                    conn,
                    pool,
                    aware(since, "since"),
                    aware(until, "until"),
                    prior=prior,
                    limit=None,
                )
                out.append([(row[0], row[1]) for row in rows])
        return out

    def price_buckets(
        self,
        pools: Sequence[tuple[str, str, str | None, str, Market | str]],
        grid: Grid,
    ) -> list[list[InEffect | None]]:
        """Each pool's prices in effect per bucket of `grid` (`buckets.fill`), across both
        tiers, on one connection: the database reduces every bucket's points to one row, so
        the read is bounded by the grid, not by the points held."""
        out: list[list[InEffect | None]] = []
        with self._db.connect() as conn:
            for provider, region, zone, instance_type, market in pools:
                pool = (provider, region, zone or "", instance_type, Market(market).value)
                rows = buckets.bucket_rows(conn, self._db.dialect, pool, grid)
                out.append(buckets.fill(rows, grid))
        return out

    def _points(
        self,
        provider: str,
        region: str,
        zone: str | None,
        instance_type: str,
        market: Market | str,
        since: datetime | None,
        until: datetime | None,
        prior: bool,
        limit: int | None,
    ) -> list[PointRow]:
        pool = (provider, region, zone or "", instance_type, Market(market).value)
        start = None if since is None else aware(since, "since")
        end = None if until is None else aware(until, "until")
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        with self._db.connect() as conn:
            return history.points_in_effect(conn, pool, start, end, prior=prior, limit=limit)

    def prune_history(
        self,
        retention: Retention,
        *,
        now: datetime | None = None,
        after: PoolKey | None = None,
        max_rows: int = 5_000,
        max_pools: int = 500,
    ) -> PruneBatch:
        """One batch of the retention pass, one transaction: for the pools after `after` (in
        key order), summarize raw points past `retention.raw` into hourly rows and remove
        them, and remove hourly rows past `retention.hourly`; stops after about `max_rows`
        removed rows or `max_pools` pools. Call again with `after=batch.after` until
        `batch.done`. `now` defaults to the store's clock."""
        at = self._db.now(now, "now")
        with self._db.begin() as conn:
            return history.prune_batch(
                conn,
                self._db.dialect,
                retention,
                at,
                after=after,
                max_rows=max_rows,
                max_pools=max_pools,
            )

    # -- provider spec cache (providers.base.SpecCache) -------------------------------------

    def load_cached(self, provider: str, key: str) -> tuple[datetime, Any] | None:
        """(fetched_at, value) saved under (provider, key), or None."""
        query = select(_SPEC.c.fetched_at, _SPEC.c.value).where(
            _SPEC.c.provider == provider, _SPEC.c.key == key
        )
        with self._db.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else (row.fetched_at, json.loads(row.value))

    def save_cached(self, provider: str, key: str, value: Any, fetched_at: datetime) -> None:
        """Replace the value under (provider, key) in one transaction."""
        row = {
            "provider": provider,
            "key": key,
            "fetched_at": aware(fetched_at, "fetched_at"),
            "value": json.dumps(value, sort_keys=True),
        }
        with self._db.begin() as conn:
            conn.execute(delete(_SPEC).where(_SPEC.c.provider == provider, _SPEC.c.key == key))
            conn.execute(insert(_SPEC).values(row))
