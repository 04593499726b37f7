"""Where gpuopt keeps its data and which database it talks to, read from the environment.

Kept free of heavy imports so the CLI can read settings without loading SQLAlchemy.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "GPUOPT_DATA_DIR"
DATABASE_URL_ENV = "GPUOPT_DATABASE_URL"

# The one PostgreSQL driver we ship (psycopg 3, see pyproject.toml); bare `postgresql://`
# would make SQLAlchemy look for psycopg2, which is not installed.
POSTGRES_SCHEME = "postgresql+psycopg"
_POSTGRES_ALIASES = frozenset({"postgresql", "postgres", POSTGRES_SCHEME})
_SQLITE_SCHEMES = frozenset({"sqlite", "sqlite+pysqlite"})


class ConfigError(ValueError):
    """A setting holds a value gpuopt cannot use."""


def _env(name: str) -> str | None:
    # An empty variable counts as unset, as shells and compose files often export blanks.
    value = os.environ.get(name, "").strip()
    return value or None


def data_dir() -> Path:
    """The data directory: `GPUOPT_DATA_DIR`, else `~/.local/share/gpuopt` (not created here)."""
    configured = _env(DATA_DIR_ENV)
    path = Path(configured) if configured else Path.home() / ".local" / "share" / "gpuopt"
    return path.expanduser().absolute()


def database_url() -> str:
    """The SQLAlchemy URL: `GPUOPT_DATABASE_URL`, else a SQLite file in the data directory."""
    configured = _env(DATABASE_URL_ENV)
    if configured is None:
        return f"sqlite:///{data_dir() / 'gpuopt.db'}"
    return normalize_database_url(configured, origin=DATABASE_URL_ENV)


def normalize_database_url(url: str, *, origin: str = "database URL") -> str:
    """Check the URL's scheme and point PostgreSQL URLs at the psycopg 3 driver.

    `origin` names where the URL came from in error messages. Messages show the scheme
    only, never the rest of the URL, which may hold a password.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        raise ConfigError(f"{origin} is not a URL (expected e.g. sqlite:///path or postgresql://…)")
    lowered = scheme.lower()
    if lowered in _SQLITE_SCHEMES:
        return url
    if lowered in _POSTGRES_ALIASES:
        return f"{POSTGRES_SCHEME}://{rest}"
    raise ConfigError(
        f"{origin} has unsupported scheme {scheme!r}; use sqlite:// or postgresql:// "
        "(PostgreSQL goes through the psycopg 3 driver)"
    )


def is_sqlite_url(url: str) -> bool:
    """True when the (normalized) URL names a SQLite database."""
    return url.partition("://")[0].lower() in _SQLITE_SCHEMES
