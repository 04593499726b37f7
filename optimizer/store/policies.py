"""The policies repository: policy versions, each policy's price-signal state, and the price
polls' status. Each write that causes an event records it in the same transaction."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select

from optimizer.store.engine import Database, aware, dialect_insert, inserted_id, table
from optimizer.store.events import write_events
from optimizer.store.records import NewEvent, PolicyVersionRecord, PollStatusRecord
from optimizer.store.tables import PolicyVersion, PollStatus, PriceSignal

_VERSION = table(PolicyVersion)
_SIGNAL = table(PriceSignal)
_POLL = table(PollStatus)


def _version(row: Any) -> PolicyVersionRecord:
    m = row._mapping
    return PolicyVersionRecord(
        id=m["id"],
        path=m["path"],
        name=m["name"],
        sha256=m["sha256"],
        outcome=m["outcome"],
        text=m["text"],
        problems=json.loads(m["problems"]) if m["problems"] else [],
        at=m["at"],
    )


class Policies:
    """What the policy watcher saw, the price-signal loop's state, and each poll's status."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- policy versions -------------------------------------------------------------------

    def record_policy_changes(
        self,
        versions: Sequence[PolicyVersionRecord],
        events: Sequence[NewEvent] = (),
        *,
        at: datetime | None = None,
    ) -> list[int]:
        """Append what the watcher saw (ids and times are assigned here) with its events."""
        now = self._db.now(at)
        ids: list[int] = []
        with self._db.begin() as conn:
            for v in versions:
                values = {
                    "path": v.path,
                    "name": v.name,
                    "sha256": v.sha256,
                    "outcome": v.outcome,
                    "text": v.text,
                    "problems": json.dumps(v.problems) if v.problems else None,
                    "at": now,
                }
                ids.append(inserted_id(conn.execute(insert(_VERSION).values(values))))
            write_events(conn, events, now)
        return ids

    def latest_policy_versions(self) -> dict[str, PolicyVersionRecord]:
        """The newest record of every path the watcher has seen."""
        newest = select(func.max(_VERSION.c.id)).group_by(_VERSION.c.path)
        query = select(_VERSION).where(_VERSION.c.id.in_(newest))
        with self._db.connect() as conn:
            return {row.path: _version(row) for row in conn.execute(query)}

    def last_loaded_version(self, path: str) -> PolicyVersionRecord | None:
        """The newest version of `path` that loaded: what stays in force while it is broken."""
        query = (
            select(_VERSION)
            .where(_VERSION.c.path == path, _VERSION.c.outcome == "loaded")
            .order_by(_VERSION.c.id.desc())
            .limit(1)
        )
        with self._db.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else _version(row)

    def policies_in_force(self) -> dict[str, PolicyVersionRecord]:
        """Per policy name, its loaded version where the name's newest record is not `removed`."""
        newest = (
            select(func.max(_VERSION.c.id))
            .where(_VERSION.c.outcome.in_(("loaded", "removed")), _VERSION.c.name.is_not(None))
            .group_by(_VERSION.c.name)
        )
        query = select(_VERSION).where(_VERSION.c.id.in_(newest))
        with self._db.connect() as conn:
            rows = [_version(row) for row in conn.execute(query)]
        return {v.name: v for v in rows if v.outcome == "loaded" and v.name}

    def policy_versions(self, name: str, limit: int = 20) -> list[PolicyVersionRecord]:
        """A policy's history, newest first."""
        query = (
            select(_VERSION)
            .where(_VERSION.c.name == name)
            .order_by(_VERSION.c.id.desc())
            .limit(limit)
        )
        with self._db.connect() as conn:
            return [_version(row) for row in conn.execute(query)]

    # -- price signals ---------------------------------------------------------------------

    def price_signals(self) -> dict[str, dict[str, Any]]:
        """Every policy's stored price-signal state (decoded JSON)."""
        with self._db.connect() as conn:
            rows = conn.execute(select(_SIGNAL.c.policy, _SIGNAL.c.state)).all()
        return {row.policy: json.loads(row.state) for row in rows}

    def save_price_signal(
        self,
        policy: str,
        state: Mapping[str, Any] | None,
        events: Sequence[NewEvent] = (),
        *,
        at: datetime | None = None,
    ) -> None:
        """Replace one policy's state (None deletes it) and record its events, atomically."""
        now = self._db.now(at)
        with self._db.begin() as conn:
            conn.execute(delete(_SIGNAL).where(_SIGNAL.c.policy == policy))
            if state is not None:
                values = {"policy": policy, "state": json.dumps(state, sort_keys=True)}
                conn.execute(insert(_SIGNAL).values({**values, "updated_at": now}))
            write_events(conn, events, now)

    # -- poll status -----------------------------------------------------------------------

    def save_poll_status(self, status: PollStatusRecord, events: Iterable[NewEvent] = ()) -> None:
        """Upsert one (provider, region, market) poll status, with its events."""
        values = {name: getattr(status, name) for name in PollStatusRecord.__dataclass_fields__}
        values["last_run_at"] = aware(status.last_run_at, "last_run_at")
        stmt = dialect_insert(self._db.dialect, _POLL)
        key = ("provider", "region", "market")
        upsert = stmt.on_conflict_do_update(
            index_elements=list(key),
            set_={name: stmt.excluded[name] for name in values if name not in key},
        )
        with self._db.begin() as conn:
            conn.execute(upsert, [values])
            write_events(conn, events, values["last_run_at"])

    def poll_statuses(self) -> list[PollStatusRecord]:
        query = select(_POLL).order_by(_POLL.c.provider, _POLL.c.market, _POLL.c.region)
        with self._db.connect() as conn:
            return [
                PollStatusRecord(
                    **{k: row._mapping[k] for k in PollStatusRecord.__dataclass_fields__}
                )
                for row in conn.execute(query)
            ]
