"""Where gpuopt keeps its data, read from the environment.

Kept free of heavy imports (and of the rest of the daemon) so the CLI can find the data
directory without loading SQLAlchemy. Which database URLs the store accepts is the store's
business (`optimizer.store.normalize_database_url`); the daemon config reads
`GPUOPT_DATABASE_URL` with its other settings.
"""

from __future__ import annotations

import os
from pathlib import Path

from optimizer.common.files import private_dir

DATA_DIR_ENV = "GPUOPT_DATA_DIR"


def _env(name: str) -> str | None:
    # An empty variable counts as unset, as shells and compose files often export blanks.
    value = os.environ.get(name, "").strip()
    return value or None


def data_dir() -> Path:
    """The data directory: `GPUOPT_DATA_DIR`, else `~/.local/share/gpuopt` (not created here)."""
    configured = _env(DATA_DIR_ENV)
    path = Path(configured) if configured else Path.home() / ".local" / "share" / "gpuopt"
    return path.expanduser().absolute()


def make_private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) for the daemon's own files: the folder itself mode
    0700, since it holds the database, the API token and the election lock. An existing
    folder keeps the mode its owner gave it."""
    return private_dir(path)
