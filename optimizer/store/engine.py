"""What the store's modules share: errors, time checks, row decoding and event writing.

`Store` (optimizer/store/__init__.py) is assembled from `StoreBase` and the mixins in
`events.py`, `jobs.py`, `policies.py` and `replicas.py`; each keeps to one area so no module
grows past a screenful of methods.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from itertools import islice
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, CursorResult, Engine, Insert, Row, Table, insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import SQLModel

from optimizer.store.tables import (
    AlertOutbox,
    Event,
    EventRecord,
    Job,
    JobRecord,
    NewEvent,
)

_T = TypeVar("_T")


class StoreError(Exception):
    """The store refused or could not complete an operation."""


# -- database URLs -----------------------------------------------------------------------------

# The one PostgreSQL driver we ship (psycopg 3, see pyproject.toml); bare `postgresql://`
# would make SQLAlchemy look for psycopg2, which is not installed.
POSTGRES_SCHEME = "postgresql+psycopg"
_POSTGRES_ALIASES = frozenset({"postgresql", "postgres", POSTGRES_SCHEME})
_SQLITE_SCHEMES = frozenset({"sqlite", "sqlite+pysqlite"})


class DatabaseUrlError(StoreError, ValueError):
    """A database URL the store cannot use (the message never shows the URL past its scheme)."""


def normalize_database_url(url: str, *, origin: str = "database URL") -> str:
    """Check the URL's scheme and point PostgreSQL URLs at the psycopg 3 driver.

    `origin` names where the URL came from in error messages. Messages show the scheme
    only, never the rest of the URL, which may hold a password.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        raise DatabaseUrlError(
            f"{origin} is not a URL (expected e.g. sqlite:///path or postgresql://…)"
        )
    lowered = scheme.lower()
    if lowered in _SQLITE_SCHEMES:
        return url
    if lowered in _POSTGRES_ALIASES:
        return f"{POSTGRES_SCHEME}://{rest}"
    raise DatabaseUrlError(
        f"{origin} has unsupported scheme {scheme!r}; use sqlite:// or postgresql:// "
        "(PostgreSQL goes through the psycopg 3 driver)"
    )


def is_sqlite_url(url: str) -> bool:
    """True when the (normalized) URL names a SQLite database."""
    return url.partition("://")[0].lower() in _SQLITE_SCHEMES


class DuplicateJobError(StoreError):
    """A job with this name already exists."""

    def __init__(self, name: str) -> None:
        super().__init__(f"a job named {name!r} already exists")
        self.name = name


def table(model: type[SQLModel]) -> Table:
    return cast(Table, model.__table__)  # type: ignore[attr-defined]


EVENT = table(Event)
JOB = table(Job)
OUTBOX = table(AlertOutbox)


def utc_now() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime, name: str) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got a naive datetime")
    return value.astimezone(UTC)


def chunks(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def job_record(row: Row[Any]) -> JobRecord:
    m = row._mapping
    fields = {name: m[name] for name in JobRecord.__dataclass_fields__}
    return JobRecord(**{**fields, "spec": json.loads(m["spec"])})


def event_record(row: Row[Any]) -> EventRecord:
    m = row._mapping
    fields = {name: m[name] for name in EventRecord.__dataclass_fields__}
    return EventRecord(**{**fields, "data": None if m["data"] is None else json.loads(m["data"])})


def inserted_id(result: CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    if key is None:
        raise StoreError("the database returned no id for the new row")
    return int(key[0])


def dialect_insert(dialect: str, target: Table) -> postgresql.Insert | sqlite.Insert:
    """INSERT with ON CONFLICT support on the two engines the store runs on."""
    if dialect == "postgresql":
        return postgresql.insert(target)
    if dialect == "sqlite":
        return sqlite.insert(target)
    raise StoreError(f"no upsert for the {dialect!r} dialect")


def event_values(event: NewEvent, at: datetime) -> dict[str, Any]:
    return {
        "at": at,
        "kind": event.kind,
        "severity": event.severity,
        "job_id": event.job_id,
        "policy": event.policy,
        "message": event.message,
        "data": None if event.data is None else json.dumps(dict(event.data), sort_keys=True),
    }


class StoreBase:
    """The engine and the clock, and the one way events (with their alerts) are written."""

    engine: Engine
    _clock: Callable[[], datetime]

    def _now(self, at: datetime | None, name: str = "at") -> datetime:
        return aware(self._clock() if at is None else at, name)

    def _outbox_insert(self) -> Insert:
        stmt = dialect_insert(self.engine.dialect.name, OUTBOX)
        # A repeated dedupe key means the alert was raised already: keep the first.
        return stmt.on_conflict_do_nothing(index_elements=["dedupe_key"])

    def _insert_event(self, conn: Connection, event: NewEvent, at: datetime) -> int:
        """Write the event and one outbox row per alert channel, on the caller's transaction."""
        event_id = inserted_id(conn.execute(insert(EVENT).values(event_values(event, at))))
        if event.alerts:
            base = event.dedupe_key or f"event:{event_id}"
            rows = [
                {
                    "event_id": event_id,
                    "channel": channel,
                    "dedupe_key": f"{base}#{channel}",
                    "state": "pending",
                    "attempts": 0,
                    "next_attempt_at": at,
                    "last_error": None,
                    "created_at": at,
                    "updated_at": at,
                    "delivered_at": None,
                }
                for channel in dict.fromkeys(event.alerts)
            ]
            conn.execute(self._outbox_insert(), rows)
        return event_id


def dump_json(value: Mapping[str, Any] | list[Any] | None) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)
