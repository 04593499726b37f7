"""What the store's repositories share: the engine and its clock, errors, time checks, row
decoding, and how an engine is made for SQLite or PostgreSQL.

Every repository (prices.py, jobs.py, events.py, policies.py, replicas.py) holds one
`Database`: the engine plus the clock that supplies "now" where a caller passes no time.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, CursorResult, Engine, Row, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool
from sqlmodel import SQLModel

from optimizer.store.records import EventRecord, JobRecord

_T = TypeVar("_T")

log = logging.getLogger(__name__)

# PostgreSQL identifiers: we splice the schema into a connection option, so allow no quoting.
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


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
    """A job with this name already exists (`state`: the state it is in, when known)."""

    def __init__(self, name: str, state: str | None = None) -> None:
        held = f" ({state})" if state else ""
        super().__init__(f"a job named {name!r} already exists{held}")
        self.name = name
        self.state = state


class JobNotEndedError(StoreError):
    """A job that has not ended cannot be removed."""

    def __init__(self, name: str, state: str) -> None:
        super().__init__(f"job {name!r} is {state}; only an ended job can be removed")
        self.name = name
        self.state = state


def table(model: type[SQLModel]) -> Table:
    return cast(Table, model.__table__)  # type: ignore[attr-defined]


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


EventListener = Callable[[Sequence[EventRecord]], None]
"""Told the events one transaction recorded, once it has committed."""

# The events written on each open `Database.begin` transaction, by its connection.
_RECORDED: weakref.WeakKeyDictionary[Connection, list[EventRecord]] = weakref.WeakKeyDictionary()
_RECORDED_LOCK = threading.Lock()


def note_event(conn: Connection, record: EventRecord) -> None:
    """Hold an event written on `conn` for the store's event listeners, who are told once the
    transaction commits (`Database.begin`), and never if it rolls back."""
    with _RECORDED_LOCK:
        held = _RECORDED.get(conn)
    if held is not None:
        held.append(record)


class Database:
    """The engine and the clock, shared by every repository of one store, and the listeners
    told of the events each transaction records once it has committed."""

    def __init__(self, engine: Engine, clock: Callable[[], datetime]) -> None:
        self.engine = engine
        self.clock = clock
        self.event_listeners: list[EventListener] = []

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def now(self, at: datetime | None = None, name: str = "at") -> datetime:
        """`at` checked to be aware, in UTC; the clock's time when None."""
        return aware(self.clock() if at is None else at, name)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A connection in a transaction, committed when the block ends (rolled back on error).
        The events written on it (`note_event`) go to `event_listeners` after the commit: a
        write that rolls back, or whose commit fails, tells them nothing."""
        held: list[EventRecord] = []
        with self.engine.begin() as conn:
            with _RECORDED_LOCK:
                _RECORDED[conn] = held
            try:
                yield conn
            finally:
                with _RECORDED_LOCK:
                    _RECORDED.pop(conn, None)
        if held:
            self._tell(held)

    def _tell(self, records: Sequence[EventRecord]) -> None:
        for listener in list(self.event_listeners):
            try:
                listener(records)
            except Exception:  # the write has committed: a listener cannot undo it
                log.exception("an event listener failed")

    def connect(self) -> AbstractContextManager[Connection]:
        """A connection for reads."""
        return self.engine.connect()


# -- making the engine -------------------------------------------------------------------------


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


def make_engine(url: str, schema: str | None) -> Engine:
    """An engine for a (normalized) URL; `schema` puts a PostgreSQL session's `search_path`
    there. SQLite gets WAL and a busy timeout; a missing file is created 0600 (SQLite gives its
    -wal and -shm files the same mode) in a folder created 0700: it holds job specs, agent
    tokens' hashes and alert payloads, none of which other users of the host should read."""
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
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args: dict[str, Any] = {}
    if schema is not None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"schema must be a plain identifier, got {schema!r}")
        connect_args["options"] = f"-csearch_path={schema}"
    return create_engine(url, connect_args=connect_args, pool_pre_ping=True)
