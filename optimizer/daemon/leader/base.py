"""What both elections share: the role, its listeners and the replica heartbeat."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from optimizer import __version__
from optimizer.clock import Clock, utc_now
from optimizer.store import Store
from optimizer.store.replicas import ReplicaRecord

log = logging.getLogger(__name__)

WAKEUP_CHANNEL = "gpuopt_wakeup"
HEARTBEAT_S = 5.0  # how often a replica refreshes its row
STALE_AFTER = timedelta(seconds=60)  # rows silent this long are replicas that are gone


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

    def _set_leading(self, leading: bool, *, stopping: bool = False) -> None:
        """Record the role; `stopping`: the replica gives leadership up as it stops (said at
        INFO: a clean stop is no trouble), rather than losing it (a WARNING)."""
        with self._role_lock:
            if self._role.leading == leading:
                return
            self._role = _Role(leading, self.clock() if leading else None)
        if leading:
            log.info("replica %s is now the leader", self.replica)
        elif stopping:
            log.info("replica %s is stopping: leadership given up", self.replica)
        else:
            log.warning("replica %s is no longer the leader", self.replica)
        # The listeners first: a takeover's loops start before this replica's row is written.
        for listener in list(self.listeners):
            try:
                listener(leading)
            except Exception:
                log.exception("leadership listener failed")
        self._heartbeat(force=True)

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
