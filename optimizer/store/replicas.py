"""The replicas repository: each daemon process reports itself and its role on a heartbeat.

Leadership is decided elsewhere (optimizer/daemon/leader.py); these rows only make it
visible to `/readyz`, `gpuopt status` style tools and people reading the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update

from optimizer.store.engine import Database, dialect_insert, table
from optimizer.store.tables import Replica

_REPLICA = table(Replica)


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    id: str
    host: str
    pid: int
    version: str
    role: str
    api_url: str | None
    started_at: datetime
    leader_since: datetime | None
    heartbeat_at: datetime


class Replicas:
    """Heartbeats and the list of replicas."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def heartbeat_replica(self, record: ReplicaRecord) -> None:
        """Insert or refresh this replica's row. A leader's row also clears the leader role
        from every other row: the lock is exclusive, so any other is a leader that died."""
        values: dict[str, Any] = {
            name: getattr(record, name) for name in ReplicaRecord.__dataclass_fields__
        }
        stmt = dialect_insert(self._db.dialect, _REPLICA).values(values)
        stmt = stmt.on_conflict_do_update(
            index_elements=["id"],
            set_={k: stmt.excluded[k] for k in values if k != "id"},
        )
        with self._db.begin() as conn:
            conn.execute(stmt)
            if record.role == "leader":
                conn.execute(
                    update(_REPLICA)
                    .where(_REPLICA.c.role == "leader", _REPLICA.c.id != record.id)
                    .values(role="follower", leader_since=None)
                )

    def seen(self, *, since: datetime | None = None) -> list[ReplicaRecord]:
        """Replicas whose last heartbeat is at or after `since` (all when None), leader first."""
        query = select(_REPLICA).order_by(_REPLICA.c.role != "leader", _REPLICA.c.started_at)
        if since is not None:
            query = query.where(_REPLICA.c.heartbeat_at >= since)
        with self._db.connect() as conn:
            return [
                ReplicaRecord(**{k: row._mapping[k] for k in ReplicaRecord.__dataclass_fields__})
                for row in conn.execute(query)
            ]

    def remove_replicas(
        self, *, ids: tuple[str, ...] = (), heartbeat_before: datetime | None = None
    ) -> int:
        """Delete the named rows and those whose heartbeat stopped before the given time."""
        removed = 0
        with self._db.begin() as conn:
            if ids:
                removed += conn.execute(delete(_REPLICA).where(_REPLICA.c.id.in_(ids))).rowcount
            if heartbeat_before is not None:
                removed += conn.execute(
                    delete(_REPLICA).where(_REPLICA.c.heartbeat_at < heartbeat_before)
                ).rowcount
        return removed
