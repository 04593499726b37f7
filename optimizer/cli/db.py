"""`gpuopt db current|upgrade|downgrade|history`: the store's schema revision.

The database is the one the daemon would use (`--config`, `$GPUOPT_CONFIG`,
`GPUOPT_DATABASE_URL`, else SQLite in the data directory). URLs are printed with the
password as ***. Alembic and SQLAlchemy are imported inside the commands.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from optimizer.cli.common import fail

if TYPE_CHECKING:
    from optimizer.store import Store
    from optimizer.store.migrate import Migrated, SchemaStatus

app = typer.Typer(
    help="Show or migrate the store's schema revision (run upgrade once per new gpuopt).",
    no_args_is_help=True,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="Daemon config (default: $GPUOPT_CONFIG, else gpuopt.yaml in the data directory).",
        dir_okay=False,
    ),
]


def configured_database_url(config: Path | None) -> str:
    """The URL the daemon would use with this config; problems exit 2 like the daemon's."""
    from optimizer.daemon.config import ConfigError, load_config
    from optimizer.store import DatabaseUrlError

    try:
        return load_config(config).effective_database_url
    except ConfigError as exc:
        fail(*exc.problems)
    except DatabaseUrlError as exc:
        fail(exc)


def sqlite_file_missing(url: str) -> bool:
    """True for a SQLite file that does not exist yet: reading it must not create it."""
    from optimizer.store import sqlite_file

    path = sqlite_file(url)
    return path is not None and not path.exists()


# How long `gpuopt db upgrade` waits for another migration of the same SQLite file.
MIGRATION_WAIT_S = 120.0


@contextmanager
def _sqlite_exclusive(store: Store, what: str) -> Iterator[None]:
    """On SQLite, hold the daemon's single-instance lock while migrating: a running daemon
    makes the migration wait for it to stop (exit 2, naming it), and no daemon starts on a
    half-migrated file. PostgreSQL needs nothing here (the migration's advisory lock)."""
    from optimizer.daemon.errors import DaemonError
    from optimizer.daemon.leader import SqliteLock, sqlite_lock_path

    if store.engine.dialect.name != "sqlite":
        yield
        return
    lock = SqliteLock(store, sqlite_lock_path(store.url), purpose=what)
    try:
        lock.claim(wait_for_migration_s=MIGRATION_WAIT_S)
    except DaemonError as exc:
        fail(exc)
    try:
        yield
    finally:
        lock.release()


def _status_lines(where: str, found: SchemaStatus) -> list[str]:
    return [
        f"database  {where}",
        f"revision  {found.revision or 'none'}",
        f"head      {found.head}",
        f"status    {found.state.value}: {found.describe()}",
    ]


@app.command("current")
def current(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Print the database's revision, this gpuopt's head, and what that means."""
    from optimizer.store import Store, migrate

    url = configured_database_url(config)
    where = migrate.display_url(url)
    if sqlite_file_missing(url):
        found = migrate.SchemaStatus(migrate.State.EMPTY, None, migrate.head())
    else:
        try:
            with Store(url) as store:
                found = migrate.status(store.engine)
        except migrate.UnreachableError as exc:
            fail(exc)
    if as_json:
        out = {
            "database": where,
            "revision": found.revision,
            "head": found.head,
            "state": found.state.value,
            "message": found.describe(),
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print("\n".join(_status_lines(where, found)))


@app.command("upgrade")
def upgrade(config: ConfigOption = None) -> None:
    """Migrate the database to this gpuopt's head (safe to run from several places at once)."""
    from optimizer.store import Store, migrate

    url = configured_database_url(config)
    try:
        with Store(url) as store, _sqlite_exclusive(store, "db upgrade"):
            done = migrate.upgrade(store.engine)
    except (migrate.SchemaError, migrate.UnreachableError) as exc:
        fail(exc)
    print(f"gpuopt: {migrate.display_url(url)}: {_upgraded(done)}")


def _upgraded(done: Migrated) -> str:
    from optimizer.store.migrate import State

    found = done.found
    if found.state is State.CURRENT:
        return f"already at {done.revision}; nothing to do"
    if found.state is State.EMPTY:
        return f"created at {done.revision}"
    if done.adopted is not None:
        start = f"recognised tables made before migrations as {done.adopted}"
        if done.adopted == done.revision:
            return f"{start}; now at {done.revision}"
        return f"{start}; upgraded to {done.revision}"
    return f"upgraded from {found.revision} to {done.revision}"


@app.command("downgrade")
def downgrade(
    revision: Annotated[
        str, typer.Argument(help="The revision to go back to (see gpuopt db history).")
    ],
    config: ConfigOption = None,
) -> None:
    """Migrate the database back to REVISION, for running an older gpuopt on it again."""
    from optimizer.store import Store, migrate

    if revision == "base":
        fail("downgrading to base would drop every table; gpuopt db downgrade does not do that")
    url = configured_database_url(config)
    try:
        with Store(url) as store, _sqlite_exclusive(store, "db downgrade"):
            done = migrate.downgrade(store.engine, revision)
    except (migrate.SchemaError, migrate.UnreachableError) as exc:
        fail(exc)
    where = migrate.display_url(url)
    if done.found.revision == done.revision:
        print(f"gpuopt: {where}: already at {done.revision}; nothing to do")
    else:
        print(f"gpuopt: {where}: downgraded from {done.found.revision} to {done.revision}")


@app.command("history")
def history() -> None:
    """List the revisions this gpuopt knows, oldest first (no database needed)."""
    from optimizer.store import migrate

    newest = migrate.head()
    for rev in migrate.history():
        mark = "  (head)" if rev.id == newest else ""
        print(f"{rev.id}  {rev.summary}{mark}")
