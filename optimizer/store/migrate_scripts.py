"""The Alembic side of migrations: a config built in code, the scripts, running a command.

The scripts are package data in `optimizer/store/migrations/` (no alembic.ini), so an installed
wheel migrates as a checkout does. `optimizer.store.migrate` is the API; this module only knows
Alembic, and imports it inside the functions.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# Alembic logs its plugin set-up and "Context impl SQLiteImpl." at INFO, noise in the daemon's
# log; optimizer.store.migrate logs what was migrated instead.
logging.getLogger("alembic").setLevel(logging.WARNING)

SCRIPTS = Path(__file__).with_name("migrations")
VERSION_TABLE = "alembic_version"

# Alembic's `op` and `context` are module globals, so two migrations in one process at once
# would send each other's statements to the wrong connection: they take turns.
_ALEMBIC = threading.RLock()


@dataclass(frozen=True, slots=True)
class Revision:
    id: str
    summary: str


def alembic_config() -> Config:
    """An Alembic config built in code: the scripts in the package, nothing read from disk."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPTS).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    return config


@functools.cache
def script() -> ScriptDirectory:
    """The revisions, read once per process."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head() -> str:
    """The newest revision this gpuopt knows."""
    newest = script().get_current_head()
    assert newest is not None, "optimizer/store/migrations/versions holds no revision"
    return newest


def history() -> list[Revision]:
    """Every revision this gpuopt knows, oldest first."""
    scripts = reversed(list(script().walk_revisions()))
    return [Revision(s.revision, s.doc.strip()) for s in scripts]


def run(conn: Connection, name: str, target: str) -> None:
    """An Alembic command (upgrade, downgrade) on `conn`, inside the caller's transaction;
    `optimizer/store/migrations/env.py` takes the connection from the config."""
    from alembic import command

    config = alembic_config()
    config.attributes["connection"] = conn
    with _ALEMBIC:
        getattr(command, name)(config, target)


def stamp(conn: Connection, revision: str) -> None:
    """Record `revision` in alembic_version (creating the table) without running anything."""
    from alembic.migration import MigrationContext

    MigrationContext.configure(conn).stamp(script(), revision)


def recorded(conn: Connection) -> tuple[str, ...]:
    """The revisions alembic_version holds: () without the table or a row, else usually one."""
    from alembic.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_heads()
