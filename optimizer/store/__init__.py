"""The store: price history, latest prices, jobs and events, on SQLite or PostgreSQL.

Tables live in `optimizer.store.tables`, migrations in `optimizer.store.migrate`; the events
and alert outbox methods in `events.py`, the job attempts in `jobs.py`, the daemon's records
(policy versions, price signals, poll status) in `policies.py` and the replica table in
`replicas.py`, mixed into `Store`. Bulk paths use SQLAlchemy Core over plain dicts
(executemany), because building ORM objects costs more than the insert itself; every public
write is one transaction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sqlalchemy import (
    Engine,
    Insert,
    Row,
    create_engine,
    delete,
    event,
    insert,
    select,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import StaticPool

from optimizer.model import OFFER_FIELDS, Market, Offer
from optimizer.store.engine import (
    DatabaseUrlError,
    DuplicateJobError,
    StoreError,
    aware,
    chunks,
    dialect_insert,
    event_record,
    inserted_id,
    is_sqlite_url,
    job_record,
    normalize_database_url,
    table,
    utc_now,
)
from optimizer.store.events import OutboxMixin
from optimizer.store.jobs import JobsMixin
from optimizer.store.policies import DaemonMixin
from optimizer.store.replicas import ReplicaMixin
from optimizer.store.tables import (
    POOL_COLUMNS,
    Event,
    EventRecord,
    Job,
    JobRecord,
    LatestPrice,
    NewEvent,
    PriceHistory,
    SpecCacheEntry,
)

__all__ = [
    "DatabaseUrlError",
    "DuplicateJobError",
    "EventRecord",
    "JobRecord",
    "NewEvent",
    "Store",
    "StoreError",
    "is_sqlite_url",
    "normalize_database_url",
]

# Rows per executemany call: big enough to amortize the round trip, small enough that one
# chunk's parameter list stays a few MB.
CHUNK_ROWS = 5_000

# PostgreSQL identifiers: we splice the schema into a connection option, so allow no quoting.
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

_HISTORY = table(PriceHistory)
_LATEST = table(LatestPrice)
_JOB = table(Job)
_EVENT = table(Event)
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
    row = {name: getattr(offer, name) for name in OFFER_FIELDS}
    row["zone"] = offer.zone or ""
    row["market"] = offer.market.value
    row["interconnect"] = offer.interconnect.value
    return row


def _offer(row: Row[Any]) -> Offer:
    values = row._mapping
    fields = {name: values[name] for name in OFFER_FIELDS}
    fields["zone"] = fields["zone"] or None
    return Offer(**fields)


def _upsert_latest(dialect: str) -> Insert:
    """INSERT … ON CONFLICT (pool) DO UPDATE, only when the incoming row is not older."""
    stmt = dialect_insert(dialect, _LATEST)
    excluded = stmt.excluded
    updates = {name: excluded[name] for name in OFFER_FIELDS if name not in POOL_COLUMNS}
    return stmt.on_conflict_do_update(
        index_elements=list(POOL_COLUMNS),
        set_=updates,
        where=excluded.observed_at >= _LATEST.c.observed_at,
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")  # off by default in SQLite
    # WAL lets the API and CLI read while the daemon writes; NORMAL sync is crash-safe in WAL
    # (a power cut may lose the last commits, never consistency).
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names, absolute; None for other databases, in-memory ones and
    `file:` URIs (whose path SQLite itself parses)."""
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if database.startswith("file:"):
        return None
    return Path(database).expanduser().absolute()


def _make_engine(url: str, schema: str | None) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if schema is not None:
            raise ValueError("schema= applies to PostgreSQL only")
        if (parsed.database or "") in ("", ":memory:"):
            # One shared connection, or every checkout would see its own empty database.
            engine = create_engine(
                url, poolclass=StaticPool, connect_args={"check_same_thread": False}
            )
        else:
            path = sqlite_file(url)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args: dict[str, Any] = {}
    if schema is not None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"schema must be a plain identifier, got {schema!r}")
        connect_args["options"] = f"-csearch_path={schema}"
    return create_engine(url, connect_args=connect_args, pool_pre_ping=True)


class Store(OutboxMixin, DaemonMixin, JobsMixin, ReplicaMixin):
    """The daemon's durable state at `url` (SQLite or PostgreSQL; `normalize_database_url`
    says which URLs are accepted, and the daemon config which one the daemon uses).

    `schema` (PostgreSQL only) puts every table in that existing schema via `search_path`;
    `clock` supplies "now" wherever a caller does not pass a time.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.url = normalize_database_url(url)
        self.schema = schema
        self.engine = _make_engine(self.url, schema)
        self._clock = clock or utc_now
        self._upsert = _upsert_latest(self.engine.dialect.name)

    # -- lifecycle -------------------------------------------------------------------------

    def create_all(self) -> None:
        """Create an empty database's schema at the newest revision, stamped so (a database
        already there gains any missing table; any other raises SchemaError). The daemon uses
        `optimizer.store.migrate.ensure_ready`; this is the fast path for tests and tools."""
        from optimizer.store.migrate import create_all

        create_all(self.engine)

    def dedicated_connection(self, **params: Any) -> Any:
        """A new DBAPI connection outside the pool, with the store's settings (search_path)
        plus `params` (libpq keywords for PostgreSQL). The caller owns and closes it: the
        leader election keeps its session-level lock on one such connection."""
        dialect = self.engine.dialect
        cargs, cparams = dialect.create_connect_args(self.engine.url)
        if self.schema is not None:
            cparams["options"] = f"-csearch_path={self.schema}"
        cparams.update(params)
        return dialect.connect(*cargs, **cparams)

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- prices ----------------------------------------------------------------------------

    def record_offers(self, offers: Iterable[Offer]) -> int:
        """Append offers to price history and advance each pool's latest price; one transaction.

        A pool's latest row only moves forward: an observation older than the stored one is
        kept in history but does not replace it. Returns the number of history rows written.
        """
        newest: dict[tuple[str, str, str | None, str, Market], Offer] = {}
        written = 0
        with self.engine.begin() as conn:
            for chunk in chunks(offers, CHUNK_ROWS):
                conn.execute(insert(_HISTORY), [_history_row(offer) for offer in chunk])
                written += len(chunk)
                for offer in chunk:
                    # One row per pool per statement: PostgreSQL refuses to upsert a row twice
                    # in one command, and it saves work on both engines.
                    held = newest.get(offer.pool)
                    if held is None or offer.observed_at >= held.observed_at:
                        newest[offer.pool] = offer
            for rows in chunks(map(_latest_row, newest.values()), CHUNK_ROWS):
                conn.execute(self._upsert, rows)
        return written

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
        with self.engine.connect() as conn:
            return [_offer(row) for row in conn.execute(query)]

    def price_history(
        self,
        provider: str,
        region: str,
        zone: str | None,
        instance_type: str,
        market: Market | str,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[tuple[datetime, float]]:
        """One pool's (observed_at, usd_per_hour) in time order, for since <= t < until."""
        t = _HISTORY
        query = (
            select(t.c.observed_at, t.c.usd_per_hour)
            .where(
                t.c.provider == provider,
                t.c.region == region,
                t.c.zone == (zone or ""),
                t.c.instance_type == instance_type,
                t.c.market == Market(market).value,
            )
            .order_by(t.c.observed_at, t.c.id)
        )
        if since is not None:
            query = query.where(t.c.observed_at >= aware(since, "since"))
        if until is not None:
            query = query.where(t.c.observed_at < aware(until, "until"))
        with self.engine.connect() as conn:
            return [(row.observed_at, row.usd_per_hour) for row in conn.execute(query)]

    # -- jobs ------------------------------------------------------------------------------

    def add_job(
        self,
        name: str,
        policy: str,
        spec: Mapping[str, Any],
        *,
        at: datetime | None = None,
        event: NewEvent | None = None,
    ) -> int:
        """Create a pending job and return its id; raise DuplicateJobError if the name is taken.

        `event` (its job_id filled in here) is recorded with its alerts in the same transaction.
        """
        now = self._now(at)
        values = {
            "name": name,
            "policy": policy,
            "spec": json.dumps(dict(spec), sort_keys=True),
            "state": "pending",
            "restarts": 0,
            "created_at": now,
            "updated_at": now,
        }
        try:
            with self.engine.begin() as conn:
                job_id = inserted_id(conn.execute(insert(_JOB).values(values)))
                if event is not None:
                    self._insert_event(conn, replace(event, job_id=job_id), now)
        except IntegrityError as err:
            if self.get_job(name) is not None:
                raise DuplicateJobError(name) from err
            raise
        return job_id

    def get_job(self, name: str) -> JobRecord | None:
        """The job with this name, or None."""
        with self.engine.connect() as conn:
            row = conn.execute(select(_JOB).where(_JOB.c.name == name)).first()
        return None if row is None else job_record(row)

    def list_jobs(self) -> list[JobRecord]:
        """Every job, oldest first."""
        with self.engine.connect() as conn:
            return [job_record(row) for row in conn.execute(select(_JOB).order_by(_JOB.c.id))]

    # -- events ----------------------------------------------------------------------------

    def add_event(
        self,
        kind: str,
        message: str,
        *,
        severity: str = "info",
        job_id: int | None = None,
        policy: str | None = None,
        data: Mapping[str, Any] | None = None,
        at: datetime | None = None,
    ) -> int:
        """Record an event and return its id."""
        values = {
            "at": self._now(at),
            "kind": kind,
            "severity": severity,
            "job_id": job_id,
            "policy": policy,
            "message": message,
            "data": None if data is None else json.dumps(dict(data), sort_keys=True),
        }
        with self.engine.begin() as conn:
            result = conn.execute(insert(_EVENT).values(values))
        return inserted_id(result)

    def events(self, job_id: int | None = None, limit: int = 100) -> list[EventRecord]:
        """The newest `limit` events (of one job, if given), returned oldest first."""
        query = select(_EVENT).order_by(_EVENT.c.at.desc(), _EVENT.c.id.desc()).limit(limit)
        if job_id is not None:
            query = query.where(_EVENT.c.job_id == job_id)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [event_record(row) for row in reversed(rows)]

    # -- provider spec cache (providers.base.SpecCache) -------------------------------------

    def load_cached(self, provider: str, key: str) -> tuple[datetime, Any] | None:
        """(fetched_at, value) saved under (provider, key), or None."""
        query = select(_SPEC.c.fetched_at, _SPEC.c.value).where(
            _SPEC.c.provider == provider, _SPEC.c.key == key
        )
        with self.engine.connect() as conn:
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
        with self.engine.begin() as conn:
            conn.execute(delete(_SPEC).where(_SPEC.c.provider == provider, _SPEC.c.key == key))
            conn.execute(insert(_SPEC).values(row))
