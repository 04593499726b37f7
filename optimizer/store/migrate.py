"""Schema revisions: what the database is at, what this gpuopt needs, and moving between them.

The Alembic scripts live in `optimizer/store/migrations/` and are run by `migrate_scripts.py`. Every
function here runs on the caller's engine, so a store's PostgreSQL `search_path` decides
where `alembic_version` and the tables are. The daemon calls `ensure_ready` at start: an
empty database is created at head, one at head is used, anything else is refused in one
line — migrating is for whoever runs `gpuopt db upgrade` once for every replica, not for
whichever daemon happens to start first. Alembic itself is imported only when used: the
revisions are read by plain SQL and from the scripts' text, and an empty database is created
in a forked child, so a daemon does not keep Alembic in memory.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import Connection, Engine, create_engine, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlmodel import SQLModel

import optimizer.store.tables  # noqa: F401  (puts every table on SQLModel.metadata)
from optimizer.common.procs import call_forked
from optimizer.store.engine import StoreError
from optimizer.store.migrate_scripts import (
    VERSION_TABLE,
    Revision,
    alembic_config,
    head,
    history,
    recorded,
    run,
    stamp,
)

__all__ = [
    "VERSION_TABLE",
    "Migrated",
    "Revision",
    "SchemaError",
    "SchemaStatus",
    "State",
    "UnreachableError",
    "alembic_config",
    "create_all",
    "current",
    "display_url",
    "downgrade",
    "ensure_ready",
    "head",
    "history",
    "status",
    "upgrade",
]

log = logging.getLogger(__name__)

# Held (pg_advisory_xact_lock) for the whole migration transaction, so two replicas running
# `gpuopt db upgrade` at once take turns; the second then finds the database at head.
# "gpuoptmg" in ASCII: a key no other gpuopt lock uses (the leader election has its own).
LOCK_KEY = int.from_bytes(b"gpuoptmg", "big")

# The revisions a database made by create_all before gpuopt had migrations can be at, newest
# first: the first daemons made the 0001 tables; just before migrations, `replica` (0002).
PRE_MIGRATION_REVISIONS = ("0002", "0001")


class SchemaError(StoreError):
    """The database's schema is not one this gpuopt runs on or can migrate; one line (the
    daemon refuses to start with it as the reason)."""


class UnreachableError(StoreError):
    """The database did not answer; one line naming it with its password hidden."""


class State(StrEnum):
    EMPTY = "empty"  # no gpuopt table, no revision
    CURRENT = "current"  # at this gpuopt's head
    OLDER = "older"  # at an earlier revision: `gpuopt db upgrade`
    NEWER = "newer"  # at a revision this gpuopt does not know: a newer gpuopt migrated it
    UNVERSIONED = "unversioned"  # gpuopt tables without a revision: made before migrations


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Where a database stands: its state, its revision (None: none recorded), our head."""

    state: State
    revision: str | None
    head: str

    def describe(self) -> str:
        """One line for people; for OLDER, UNVERSIONED and NEWER it says what to do."""
        if self.state is State.EMPTY:
            return (
                f"the database is empty; gpuopt db upgrade or the daemon creates it at {self.head}"
            )
        if self.state is State.CURRENT:
            return f"the database is at {self.head}, the newest revision this gpuopt knows"
        if self.state is State.OLDER:
            return (
                f"the database is at revision {self.revision}, this gpuopt needs {self.head}: "
                "run gpuopt db upgrade"
            )
        if self.state is State.UNVERSIONED:
            return (
                "the database has no schema revision (an earlier gpuopt made its tables), this "
                f"gpuopt needs {self.head}: run gpuopt db upgrade"
            )
        return (
            f"the database was migrated by a newer gpuopt: revision {self.revision} is unknown "
            f"to this version (head {self.head}); upgrade gpuopt"
        )


@dataclass(frozen=True, slots=True)
class Migrated:
    """What `upgrade` or `downgrade` did: the status it found under the lock, the revision an
    unversioned database was recognised as (stamped), and the revision it left (None: base)."""

    found: SchemaStatus
    adopted: str | None
    revision: str | None


def _known(revision: str) -> bool:
    return revision in {r.id for r in history()}


# -- reading the database ---------------------------------------------------------------------


def display_url(url: str | URL) -> str:
    """The URL with its password as ***, safe to print."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def reason(exc: DBAPIError, engine: Engine) -> str:
    """The driver's first line about `exc`, with the URL's password (if any) as ***."""
    said = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
    password = engine.url.password
    return said.replace(str(password), "***") if password else said


@contextmanager
def _connection(engine: Engine) -> Iterator[Connection]:
    """A connection, or UnreachableError in one line (the driver's first line, no password)."""
    try:
        conn = engine.connect()
    except DBAPIError as exc:
        raise UnreachableError(
            f"cannot reach the database {display_url(engine.url)}: {reason(exc, engine)}"
        ) from None
    with conn:
        yield conn


@contextmanager
def _migrating(engine: Engine) -> Iterator[Connection]:
    """One transaction that holds the migration lock; committed when the block ends."""
    with _connection(engine) as conn:
        if conn.dialect.name == "sqlite":
            # pysqlite opens no transaction before DDL by itself, so open one; IMMEDIATE takes
            # the write lock now, and a second upgrader waits for it (busy_timeout).
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
        yield conn
        conn.commit()


def _gpuopt_tables() -> set[str]:
    """Table names that mean "gpuopt was here" (every table some revision makes)."""
    names = set(SQLModel.metadata.tables)
    for revision in PRE_MIGRATION_REVISIONS:
        names.update(_made_by(revision))
    return names


def _status(conn: Connection) -> SchemaStatus:
    newest = head()
    revisions = recorded(conn)
    if not revisions:
        present = set(inspect(conn).get_table_names()) & set(SQLModel.metadata.tables)
        return SchemaStatus(State.UNVERSIONED if present else State.EMPTY, None, newest)
    revision = ", ".join(revisions)
    if revision == newest:
        return SchemaStatus(State.CURRENT, revision, newest)
    if len(revisions) == 1 and _known(revision):
        return SchemaStatus(State.OLDER, revision, newest)
    return SchemaStatus(State.NEWER, revision, newest)


def current(engine: Engine) -> str | None:
    """The database's revision, or None when it records none."""
    return status(engine).revision


def status(engine: Engine) -> SchemaStatus:
    """Where the database stands against this gpuopt; reads only."""
    with _connection(engine) as conn:
        return _status(conn)


# -- changing it ------------------------------------------------------------------------------


def ensure_ready(engine: Engine) -> SchemaStatus:
    """For the daemon's start: create an empty database at head (through the migrations), use
    one at head, and raise SchemaError for any other without touching it."""
    found = status(engine)
    if found.state is State.CURRENT:
        return found
    if found.state is not State.EMPTY:
        raise SchemaError(found.describe())
    done = _create_apart(engine)
    return SchemaStatus(State.CURRENT, done.revision, found.head)


def _create_apart(engine: Engine) -> Migrated:
    """An empty database created at head through the migrations, in a forked child where the
    database is a file or a server: a daemon at head never imports Alembic, and one that
    created its database does not keep it (bench/daemon.py). An in-memory SQLite database is
    the process's own: created here."""
    if engine.url.get_backend_name() == "sqlite" and engine.url.database in (None, "", ":memory:"):
        return _upgrade(engine, only_empty=True)

    def create() -> Migrated:
        engine.dispose(close=False)  # the parent's pooled connections stay the parent's
        return _upgrade(engine, only_empty=True)

    return call_forked(create)


def upgrade(engine: Engine) -> Migrated:
    """Migrate to head under the migration lock, in one transaction.

    An unversioned database is first recognised as the pre-migration revision its tables
    match and stamped so; one that matches none, or one at an unknown revision, raises
    SchemaError and is left as it was.
    """
    return _upgrade(engine, only_empty=False)


def _upgrade(engine: Engine, *, only_empty: bool) -> Migrated:
    with _migrating(engine) as conn:
        found = _status(conn)  # again, under the lock: another upgrader may have finished
        if found.state is State.CURRENT:
            return Migrated(found, None, found.head)
        if found.state is State.NEWER or (only_empty and found.state is not State.EMPTY):
            raise SchemaError(found.describe())
        adopted = _adopt(conn) if found.state is State.UNVERSIONED else None
        try:
            run(conn, "upgrade", "head")
        except DBAPIError as exc:
            raise SchemaError(
                f"the migration to {found.head} failed and was rolled back: {reason(exc, engine)}"
            ) from exc
    log.info("database migrated from %s to %s", found.revision or found.state.value, found.head)
    return Migrated(found, adopted, found.head)


def downgrade(engine: Engine, revision: str) -> Migrated:
    """Migrate back to `revision` ("base" drops every table) under the migration lock."""
    order = [r.id for r in history()]
    with _migrating(engine) as conn:
        found = _status(conn)
        if found.state in (State.EMPTY, State.UNVERSIONED, State.NEWER):
            raise SchemaError(f"cannot downgrade: {found.describe()}")
        if revision != "base" and revision not in order:
            raise SchemaError(
                f"unknown revision {revision!r}; this gpuopt knows {', '.join(order)}"
            )
        assert found.revision is not None
        if revision != "base" and order.index(revision) > order.index(found.revision):
            raise SchemaError(
                f"revision {revision} is newer than the database's {found.revision}: "
                "use gpuopt db upgrade"
            )
        if revision != found.revision:
            try:
                run(conn, "downgrade", revision)
            except DBAPIError as exc:
                raise SchemaError(
                    f"the migration to {revision} failed and was rolled back: {reason(exc, engine)}"
                ) from exc
            log.info("database migrated back from %s to %s", found.revision, revision)
    return Migrated(found, None, None if revision == "base" else revision)


def create_all(engine: Engine) -> None:
    """The schema at head from the table definitions, stamped at head, in one transaction.

    What the migrations make (tests/test_migrations.py compares the two), without running each
    revision: tests create a store per test. A database at head gains any missing table; any
    other state raises SchemaError rather than leave a half-migrated schema.
    """
    with _migrating(engine) as conn:
        found = _status(conn)
        if found.state not in (State.EMPTY, State.CURRENT):
            raise SchemaError(found.describe())
        SQLModel.metadata.create_all(conn)
        if found.state is State.EMPTY:
            stamp(conn, found.head)


# -- databases made before migrations ---------------------------------------------------------


@functools.cache
def _made_by(revision: str) -> Mapping[str, frozenset[str]]:
    """Table -> column names that migrating an empty database to `revision` makes."""
    engine = create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            run(conn, "upgrade", revision)
            return _columns(conn)
    finally:
        engine.dispose()


def _columns(conn: Connection, only: set[str] | None = None) -> dict[str, frozenset[str]]:
    found = inspect(conn)
    return {
        name: frozenset(c["name"] for c in found.get_columns(name))
        for name in found.get_table_names()
        if name != VERSION_TABLE and (only is None or name in only)
    }


def _differences(
    actual: Mapping[str, frozenset[str]], expected: Mapping[str, frozenset[str]]
) -> Iterator[str]:
    for name in sorted(expected.keys() - actual.keys()):
        yield f"no table {name}"
    for name in sorted(actual.keys() - expected.keys()):
        yield f"unexpected table {name}"
    for name in sorted(actual.keys() & expected.keys()):
        if missing := sorted(expected[name] - actual[name]):
            yield f"{name} lacks {', '.join(missing)}"
        if extra := sorted(actual[name] - expected[name]):
            yield f"{name} has unexpected {', '.join(extra)}"


def _adopt(conn: Connection) -> str:
    """Stamp an unversioned database with the pre-migration revision its tables match.

    Tables and column names must be exactly that revision's: a database from an older
    gpuopt (create_all never added columns to a table) would fail later, half-migrated.
    """
    actual = _columns(conn, only=_gpuopt_tables())
    for revision in PRE_MIGRATION_REVISIONS:
        if actual == _made_by(revision):
            stamp(conn, revision)
            log.info("recognised the unversioned database as revision %s", revision)
            return revision
    nearest = min(
        PRE_MIGRATION_REVISIONS,
        key=lambda r: len(list(_differences(actual, _made_by(r)))),
    )
    problems = list(_differences(actual, _made_by(nearest)))
    shown = "; ".join(problems[:4]) + (f"; {len(problems) - 4} more" if len(problems) > 4 else "")
    raise SchemaError(
        "the database has gpuopt tables but no schema revision, and they are not the schema "
        f"an earlier gpuopt made (against revision {nearest}: {shown}); gpuopt will not guess "
        "its revision: copy the data into a database made by gpuopt db upgrade"
    )
