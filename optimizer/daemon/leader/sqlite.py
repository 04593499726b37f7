"""SQLite: one daemon per database file, by an exclusive flock on `<database>.lock`."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from optimizer.daemon.errors import DaemonError
from optimizer.daemon.leader.base import HEARTBEAT_S, Election
from optimizer.daemon.settings import make_private_dir
from optimizer.store import Store, sqlite_file

HOLDER_SETTLE_S = 1.0  # how long an empty lock file is read again (see `claim`)

log = logging.getLogger(__name__)


class SqliteLock(Election):
    """One daemon per SQLite database: an exclusive flock on `<database>.lock`."""

    def __init__(
        self, store: Store, path: Path | None, *, purpose: str = "daemon", **kwargs: Any
    ) -> None:
        super().__init__(store, **kwargs)
        self.path = path  # None: an in-memory database, private to this process anyway
        # What holds the lock, for the message another process gets: the daemon, or a
        # migration (`gpuopt db upgrade` takes it too, so no daemon starts mid-migration).
        self.purpose = purpose
        self._fd: int | None = None

    def claim(self, *, wait_for_migration_s: float = 0.0) -> None:
        """Take the file lock, or raise DaemonError naming the process that holds it. Called
        before the daemon touches the database, so a refused second daemon changes nothing.
        A holder that is a migration is waited for up to `wait_for_migration_s` (two
        `gpuopt db upgrade` runs take turns); a daemon never is."""
        if self.path is not None and self._fd is None:
            make_private_dir(self.path.parent)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            deadline = time.monotonic() + wait_for_migration_s
            # The holder writes who it is just after taking the lock: an empty file is one
            # caught in between, read again for a moment before it counts as a daemon's.
            settle = time.monotonic() + HOLDER_SETTLE_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = _read_holder(fd)
                    if not holder and time.monotonic() < settle:
                        self._stop.wait(0.01)
                        continue
                    waiting = holder.get("purpose", "daemon") != "daemon"
                    if not waiting or time.monotonic() >= deadline:
                        os.close(fd)
                        raise DaemonError(self._busy_message(holder)) from None
                    self._stop.wait(0.05)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(self._holder()).encode() + b"\n", 0)
            self._fd = fd

    def start(self) -> None:
        self.claim()
        self._set_leading(True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="replica-heartbeat", daemon=True)
        self._thread.start()

    def _holder(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "replica": self.replica,
            "since": self.clock().isoformat(timespec="seconds"),
            "purpose": self.purpose,
        }

    def _busy_message(self, holder: dict[str, Any]) -> str:
        purpose = holder.get("purpose", "daemon")
        who = "another gpuopt daemon" if purpose == "daemon" else f"gpuopt {purpose}"
        if holder.get("pid"):
            who += f" (pid {holder['pid']} on {holder.get('host', '?')}"
            who += f", since {holder['since']})" if holder.get("since") else ")"
        database = self.path.with_suffix("") if self.path is not None else "?"
        if purpose != "daemon":
            return f"{who} is using the SQLite database {database}; try again when it is done"
        if self.purpose != "daemon":
            return f"{who} is using the SQLite database {database}; stop it before migrating"
        return (
            f"{who} is already using the SQLite database {database}; only one daemon may "
            "run on it. Stop that one first, or use PostgreSQL (GPUOPT_DATABASE_URL) to run "
            "several replicas"
        )

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._heartbeat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._forget()
        self._set_leading(False, stopping=True)
        self.release()

    def release(self) -> None:
        """Give the file lock back (what `claim` took)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)  # the file stays: removing it would race a starting daemon
            self._fd = None


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def sqlite_lock_path(database_url: str) -> Path | None:
    """Where the single-instance lock for a SQLite URL lives (None for in-memory)."""
    path = sqlite_file(database_url)
    return None if path is None else path.with_name(path.name + ".lock")
