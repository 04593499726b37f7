"""The election that fits the store's engine."""

from __future__ import annotations

from collections.abc import Callable

from optimizer.clock import Clock, utc_now
from optimizer.daemon.leader.base import Election
from optimizer.daemon.leader.postgres import PostgresElection
from optimizer.daemon.leader.sqlite import SqliteLock, sqlite_lock_path
from optimizer.store import Store


def make_leadership(
    store: Store,
    *,
    check_s: float,
    lease_s: float,
    on_wakeup: Callable[[], None],
    api_url: Callable[[], str | None],
    clock: Clock = utc_now,
) -> Election:
    """A file lock on SQLite (one daemon per database), an advisory-lock election on
    PostgreSQL."""
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
