"""The Alembic side of migrations: a config built in code, the scripts, running a command.

The scripts are package data in `optimizer/store/migrations/` (no alembic.ini), so an installed
wheel migrates as a checkout does. `optimizer.store.migrate` is the API; this module only knows
Alembic, and imports it inside the functions.
"""

from __future__ import annotations

import ast
import functools
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

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


# A script's own `revision = "0012"` and `down_revision = "0011"` lines.
_ASSIGNED = re.compile(r"^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.M)


@functools.cache
def head() -> str:
    """The newest revision this gpuopt knows: the one no script names as its down_revision,
    read from the scripts' text, so the daemon's start (its database at head) needs no
    Alembic (about 10 MB of a daemon's memory, bench/daemon.py). Where the text does not
    give one head, Alembic's answer (tests/test_migrations.py holds the two to each other)."""
    revisions: set[str] = set()
    downs: set[str | None] = set()
    for path in (SCRIPTS / "versions").glob("*.py"):
        found = dict(_ASSIGNED.findall(path.read_text(encoding="utf-8")))
        try:
            revisions.add(ast.literal_eval(found["revision"]))
            down = ast.literal_eval(found.get("down_revision", "None"))
        except (KeyError, ValueError, SyntaxError):
            return _alembic_head()
        downs.update(down if isinstance(down, tuple | list) else [down])
    heads = revisions - downs
    return heads.pop() if len(heads) == 1 else _alembic_head()


def _alembic_head() -> str:
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
    """The revisions alembic_version holds: () without the table or a row, else usually one.
    Plain SQL, as Alembic reads them (the table where the connection's search path finds it),
    so the daemon's start needs no Alembic."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return ()
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
    return tuple(str(value) for value in rows.scalars())
