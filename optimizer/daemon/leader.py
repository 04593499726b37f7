"""Leadership: which daemon process runs the loops that act (poll, queue, reconcile, deliver).

Every replica serves the API; only the leader polls prices, reconciles jobs and sends
alerts, so no two processes launch the same job or send the same alert.

- **PostgreSQL**: replicas compete for a session-level advisory lock held on a dedicated
  connection (outside the pool). The lock is keyed by the schema, so deployments sharing a
  database in different schemas elect separately. PostgreSQL frees the lock the moment the
  leader's session ends: a clean stop, a crash or SIGKILL (the kernel closes the socket),
  or, when the leader's host vanishes, the server's TCP keepalives giving up (set on the
  session to about 12 s). Followers retry every `check_s`, so one takes over within
  `check_s` of the release.
- **Lease**: the leader re-confirms the lock in `pg_locks` every `check_s` and counts as
  leader only while its last confirmation is younger than `lease_s`. A leader cut off from
  the database stops acting after `lease_s`, before the server drops its session and a
  follower can win; launches also carry idempotency keys, so a launch in flight across a
  takeover is not repeated.
- **Wake-ups**: a follower that receives an agent's interruption notice sends
  `NOTIFY gpuopt_wakeup` (payload: its schema); the leader LISTENs on its lock connection
  and runs a reconcile pass at once, so recovery does not wait for the next tick. A leader
  that stops cleanly announces its release on the same channel, and the followers try for
  the lock at once (a rolling update hands over without waiting a round).
- **SQLite**: one daemon per database file. The first takes an exclusive `flock` on
  `<database>.lock` and leads for its lifetime; a second one exits with a message naming
  the holder. The kernel drops the lock when the holder exits, however it exits.

The connection that holds the lock must be a real session: a pooler in transaction mode
(pgbouncer's default) would hand the lock to whoever gets the server connection next.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from optimizer import __version__
from optimizer.clock import Clock, utc_now
from optimizer.daemon.errors import DaemonError
from optimizer.store import Store, sqlite_file
from optimizer.store.replicas import ReplicaRecord

log = logging.getLogger(__name__)

WAKEUP_CHANNEL = "gpuopt_wakeup"
HEARTBEAT_S = 5.0  # how often a replica refreshes its row
STALE_AFTER = timedelta(seconds=60)  # rows silent this long are replicas that are gone

# Server-side TCP settings for the lock's session: a vanished leader host is noticed after
# about idle + interval * count = 12 s of silence (or 12 s of unacknowledged data) and its
# lock freed (the defaults are hours). That is longer than the default lease (6 s), so a
# leader cut off from the database has stopped acting before anyone else can win, and short
# enough that a follower (trying every 2 s) takes over within 15 s.
_SESSION_SETTINGS = {
    "tcp_keepalives_idle": "6",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "12000",
    "statement_timeout": "5000",
}
# The client side of the same: keepalives, and connecting gives up rather than hangs.
_CLIENT_PARAMS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}


def first_line(exc: BaseException) -> str:
    """An exception as one log line (database errors carry the SQL on later lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def replica_id() -> str:
    """host:pid:random — unique per process, readable in logs and `pg_stat_activity`."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


Listener = Callable[[bool], None]


@dataclass
class _Role:
    leading: bool = False
    since: datetime | None = None


class Election:
    """What the daemon needs from an election, and what both kinds share: the role, its
    listeners (called with True on becoming leader, False on ceasing) and the heartbeat."""

    def __init__(
        self,
        store: Store,
        *,
        replica: str | None = None,
        api_url: Callable[[], str | None] = lambda: None,
        clock: Clock = utc_now,
    ) -> None:
        self.store = store
        self.replica = replica or replica_id()
        self.api_url = api_url
        self.clock = clock
        self.listeners: list[Listener] = []
        self._role = _Role()
        self._role_lock = threading.Lock()
        self._started_at = clock()
        self._beat_at = 0.0
        self._reported = False  # a row of ours exists (to remove when stopping)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def claim(self) -> None:
        """Before the store is touched: refuse to run where this daemon may not (SQLite)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def nudge(self) -> None:
        """Ask the leader, wherever it runs, for a reconcile pass now."""

    @property
    def role(self) -> str:
        return "leader" if self.is_leader else "follower"

    @property
    def is_leader(self) -> bool:
        return self._role.leading

    @property
    def leader_since(self) -> datetime | None:
        return self._role.since if self._role.leading else None

    def _set_leading(self, leading: bool) -> None:
        with self._role_lock:
            if self._role.leading == leading:
                return
            self._role = _Role(leading, self.clock() if leading else None)
        if leading:
            log.info("replica %s is now the leader", self.replica)
        else:
            log.warning("replica %s is no longer the leader", self.replica)
        self._heartbeat(force=True)
        for listener in list(self.listeners):
            try:
                listener(leading)
            except Exception:
                log.exception("leadership listener failed")

    def _heartbeat(self, *, force: bool = False) -> None:
        """Refresh this replica's row every HEARTBEAT_S; the leader also prunes dead rows."""
        now_mono = time.monotonic()
        if not force and now_mono - self._beat_at < HEARTBEAT_S:
            return
        self._beat_at = now_mono
        now = self.clock()
        try:
            self.store.replicas.heartbeat_replica(
                ReplicaRecord(
                    id=self.replica,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    version=__version__,
                    role=self.role,
                    api_url=self.api_url(),
                    started_at=self._started_at,
                    leader_since=self.leader_since,
                    heartbeat_at=now,
                )
            )
            self._reported = True
            if self.is_leader:
                self.store.replicas.remove_replicas(heartbeat_before=now - STALE_AFTER)
        except Exception as exc:  # the store being down must not stop the election
            log.warning("replica heartbeat failed: %s", first_line(exc))

    def _forget(self) -> None:
        if not self._reported:
            return
        try:
            self.store.replicas.remove_replicas(ids=(self.replica,))
            self._reported = False
        except Exception as exc:
            log.warning("could not remove this replica's row: %s", first_line(exc))


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
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            deadline = time.monotonic() + wait_for_migration_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = _read_holder(fd)
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
        self._set_leading(False)
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


# The advisory-lock key: a 64-bit hash of the database and the schema the session works in.
LOCK_KEY_SQL = (
    "hashtextextended('gpuopt-leader:' || current_database() || '/' || current_schema(), 0)"
)


class PostgresElection(Election):
    """Replicas compete for a session-level advisory lock (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        check_s: float = 2.0,
        lease_s: float = 6.0,
        on_wakeup: Callable[[], None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        super().__init__(store, **kwargs)
        self.monotonic = monotonic
        if lease_s <= check_s:
            raise ValueError("lease_s must be longer than check_s")
        self.check_s = check_s
        self.lease_s = lease_s
        self.on_wakeup = on_wakeup
        self._conn: Any = None
        self._key: int | None = None
        self._schema: str | None = None
        self._confirmed = 0.0  # monotonic time the lock was last seen held
        self._connect_failures = 0

    @property
    def is_leader(self) -> bool:
        return self._role.leading and self.monotonic() - self._confirmed < self.lease_s

    def start(self) -> None:
        """Try once now (so a lone replica leads at once), then keep trying on a thread."""
        self._stop.clear()
        self._step()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop competing; release the lock and announce it (a follower takes over at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        was_leader = self._role.leading
        self._set_leading(False)
        if self._conn is not None and was_leader:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
                # Followers listening on the channel try for the lock now, not next round.
                self._conn.execute(
                    "SELECT pg_notify(%s, 'released:' || current_schema())", (WAKEUP_CHANNEL,)
                )
            except Exception as exc:
                log.debug("unlock failed (the session ends anyway): %s", exc)
        self._disconnect()
        self._forget()

    def nudge(self) -> None:
        """NOTIFY the leader to reconcile now; the leader itself just wakes locally."""
        if self.is_leader:
            self.on_wakeup()
            return
        from sqlalchemy import text

        try:
            with self.store.engine.begin() as conn:
                conn.execute(
                    text("SELECT pg_notify(:channel, current_schema())"),
                    {"channel": WAKEUP_CHANNEL},
                )
        except Exception as exc:
            log.warning("could not notify the leader: %s", exc)

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wait()
            if not self._stop.is_set():
                self._step()

    def _wait(self) -> None:
        """Wait `check_s` listening on the lock connection: the leader for wake-ups, a
        follower for the leader's release (a clean stop), which ends its wait at once."""
        if self._conn is None:
            self._stop.wait(self.check_s)
            return
        deadline = time.monotonic() + self.check_s
        try:
            while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
                for note in self._conn.notifies(timeout=min(left, 0.5)):
                    if self._role.leading and note.payload == self._schema:
                        self.on_wakeup()
                    elif not self._role.leading and note.payload == f"released:{self._schema}":
                        return
        except Exception as exc:
            self._lost(f"the lock connection failed while listening: {first_line(exc)}")

    def _step(self) -> None:
        """One round: connect if needed, then try to win or confirm the lock."""
        if self._conn is None and not self._connect():
            return
        try:
            # The lease counts from before the query: the server saw the lock held no earlier.
            asked = self.monotonic()
            if self._role.leading:
                if self._holds():
                    self._confirmed = asked
                else:
                    self._lost("the advisory lock is no longer held")
                    return
            else:
                won = self._conn.execute(
                    "SELECT pg_try_advisory_lock(%s)", (self._key,)
                ).fetchone()[0]
                if won:
                    self._confirmed = asked
                    self._set_leading(True)
        except Exception as exc:
            self._lost(f"the lock connection failed: {first_line(exc)}")
            return
        self._heartbeat()

    def _holds(self) -> bool:
        key = self._key
        assert key is not None
        unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
        row = self._conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid() AND classid::bigint = %s AND objid::bigint = %s"
            " AND objsubid = 1",
            (unsigned >> 32, unsigned & 0xFFFF_FFFF),
        ).fetchone()
        return bool(row[0])

    def _connect(self) -> bool:
        try:
            conn = self.store.dedicated_connection(
                application_name=f"gpuopt leader election {self.replica}"[:63], **_CLIENT_PARAMS
            )
            conn.autocommit = True
            for name, value in _SESSION_SETTINGS.items():
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            row = conn.execute(f"SELECT {LOCK_KEY_SQL}, current_schema()").fetchone()
            self._key, self._schema = int(row[0]), str(row[1])
            conn.execute(f"LISTEN {WAKEUP_CHANNEL}")
        except Exception as exc:
            self._connect_failures += 1
            if self._connect_failures in (1, 10) or self._connect_failures % 100 == 0:
                log.warning(
                    "leader election cannot reach PostgreSQL (%d tries): %s",
                    self._connect_failures,
                    first_line(exc),
                )
            return False
        if self._connect_failures:
            log.info("leader election reconnected to PostgreSQL")
        self._connect_failures = 0
        self._conn = conn
        return True

    def _lost(self, why: str) -> None:
        if self._role.leading:
            log.error("leadership lost: %s", why)
        else:
            log.warning("leader election: %s", why)
        self._set_leading(False)
        self._disconnect()

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the lock connection failed", exc_info=True)


def sqlite_lock_path(database_url: str) -> Path | None:
    """Where the single-instance lock for a SQLite URL lives (None for in-memory)."""
    path = sqlite_file(database_url)
    return None if path is None else path.with_name(path.name + ".lock")


def make_leadership(
    store: Store,
    *,
    check_s: float,
    lease_s: float,
    on_wakeup: Callable[[], None],
    api_url: Callable[[], str | None],
    clock: Clock = utc_now,
) -> Election:
    """The election that fits the store's engine."""
    if store.engine.dialect.name == "sqlite":
        return SqliteLock(store, sqlite_lock_path(store.url), api_url=api_url, clock=clock)
    return PostgresElection(
        store,
        check_s=check_s,
        lease_s=lease_s,
        on_wakeup=on_wakeup,
        api_url=api_url,
        clock=clock,
    )


__all__ = [
    "WAKEUP_CHANNEL",
    "Election",
    "PostgresElection",
    "SqliteLock",
    "make_leadership",
    "replica_id",
    "sqlite_lock_path",
]
