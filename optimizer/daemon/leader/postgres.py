"""PostgreSQL: replicas compete for a session-level advisory lock (see the package docstring)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from optimizer.daemon.leader.base import WAKEUP_CHANNEL, Election, first_line
from optimizer.store import Store

log = logging.getLogger(__name__)

# Server-side TCP settings for the lock's session: a vanished leader host is noticed after
# about idle + interval * count = 12 s of silence (or 12 s of unacknowledged data) and its
# lock freed (the defaults are hours). That is longer than the default lease (6 s), so a
# leader cut off from the database has stopped acting before anyone else can win, and short
# enough that a follower (waiting for the lock) takes over within 15 s.
_SESSION_SETTINGS = {
    "tcp_keepalives_idle": "6",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "12000",
}
_STATEMENT_TIMEOUT_S = 5.0  # any statement on the lock's session but a follower's lock wait
# The client side of the same: keepalives, and connecting gives up rather than hangs.
_CLIENT_PARAMS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}


# The advisory-lock key: a 64-bit hash of the database and the schema the session works in.
LOCK_KEY_SQL = (
    "hashtextextended('gpuopt-leader:' || current_database() || '/' || current_schema(), 0)"
)


class PostgresElection(Election):
    """Replicas compete for a session-level advisory lock (see the module docstring).

    A follower does not poll for the lock: each round it waits for it in the server
    (`pg_advisory_lock` under a `lock_timeout` of `check_s`), and PostgreSQL grants it to a
    waiter the moment the holder's session ends or unlocks. So a takeover does not wait for
    the follower's next round: after a SIGKILL, the time to take over is the time the server
    takes to see the leader's connection close (at once on one host or when the kernel
    resets it; the keepalives above when the host vanished) plus one round trip. The rounds
    remain, for the follower's heartbeat and to reconnect.
    """

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
        self._step(wait=False)
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop competing; release the lock and announce it (a follower takes over at once)."""
        self._stop.set()
        if self._thread is not None:
            # A follower's thread may be waiting for the lock in the server: cancel the wait
            # rather than let it run out (again, should a new wait begin meanwhile).
            while self._thread.is_alive():
                self._cancel_wait()
                self._thread.join(timeout=0.2)
            self._thread = None
        was_leader = self._role.leading
        self._set_leading(False, stopping=True)
        if self._conn is not None and was_leader:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
                # Followers waiting for the lock are granted it by the unlock; the notice is
                # for those of older versions, which try at their next round unless told.
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
        """Between rounds: the leader waits `check_s` listening for wake-ups on the lock
        connection; a follower goes straight back to waiting for the lock in the server
        (its round's wait), but for a pause after a failed connection."""
        if self._conn is None:
            self._stop.wait(self.check_s)
            return
        if not self._role.leading:
            return
        deadline = time.monotonic() + self.check_s
        try:
            while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
                for note in self._conn.notifies(timeout=min(left, 0.5)):
                    if note.payload == self._schema:
                        self.on_wakeup()
        except Exception as exc:
            self._lost(f"the lock connection failed while listening: {first_line(exc)}")

    def _step(self, *, wait: bool = True) -> None:
        """One round: connect if needed, then win the lock (a follower waits up to `check_s`
        for it, unless told not to) or confirm it."""
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
            elif self._await_lock(wait):
                # The wait may have begun up to check_s before the grant: count the lease
                # from a check made after it, so that a new leader starts with a whole one.
                asked = self.monotonic()
                if not self._holds():
                    self._lost("the advisory lock was granted, then not held")
                    return
                self._confirmed = asked
                self._set_leading(True)
        except Exception as exc:
            self._lost(f"the lock connection failed: {first_line(exc)}")
            return
        self._heartbeat()

    def _await_lock(self, wait: bool) -> bool:
        """Wait up to `check_s` in the server for the lock (or only try, without `wait`);
        whether it was granted. Wake-ups that reached the follower's LISTEN meanwhile are
        dropped (they are the leader's)."""
        import psycopg.errors

        try:
            if wait:
                self._conn.execute("SELECT pg_advisory_lock(%s)", (self._key,))
                won = True
            else:
                query = "SELECT pg_try_advisory_lock(%s)"
                won = bool(self._conn.execute(query, (self._key,)).fetchone()[0])
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
            won = False  # the round is over (lock_timeout), or stop() cancelled the wait
        for _ in self._conn.notifies(timeout=0):
            pass
        return won

    def _cancel_wait(self) -> None:
        conn = self._conn
        if conn is not None and not self._role.leading:
            try:
                conn.cancel_safe(timeout=2.0)
            except Exception as exc:
                log.debug("cancelling the lock wait failed: %s", exc)

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
            settings = {
                **_SESSION_SETTINGS,
                # A follower's round is one wait for the lock; the statement timeout only
                # guards the other statements (a hung server), so it outlasts that wait.
                "lock_timeout": str(round(self.check_s * 1000)),
                "statement_timeout": str(round((self.check_s + _STATEMENT_TIMEOUT_S) * 1000)),
            }
            for name, value in settings.items():
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
