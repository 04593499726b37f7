"""The daemon's own records: job cancellation and queries, policy versions, price-signal
state and poll status. Each write that causes an event records it in the same transaction."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from optimizer.store.engine import (
    JOB,
    StoreBase,
    aware,
    dialect_insert,
    inserted_id,
    job_record,
    table,
)
from optimizer.store.tables import (
    TERMINAL_JOB_STATES,
    JobRecord,
    LatestPrice,
    NewEvent,
    PolicyVersion,
    PolicyVersionRecord,
    PollStatus,
    PollStatusRecord,
    PriceSignal,
)

_VERSION = table(PolicyVersion)
_SIGNAL = table(PriceSignal)
_POLL = table(PollStatus)
_LATEST = table(LatestPrice)
_TERMINAL_STATES = sorted(TERMINAL_JOB_STATES)


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


class DaemonMixin(StoreBase):
    """Store methods the daemon's loops and API use beyond prices, jobs and events."""

    # -- jobs ------------------------------------------------------------------------------

    def cancel_job(
        self, name: str, *, event: NewEvent | None = None, at: datetime | None = None
    ) -> tuple[JobRecord | None, bool]:
        """Set a job `cancelled` unless it already ended: (the job after, whether it changed)."""
        now = self._now(at)
        with self.engine.begin() as conn:
            changed = conn.execute(
                update(JOB)
                .where(JOB.c.name == name, JOB.c.state.not_in(_TERMINAL_STATES))
                .values(state="cancelled", reason="cancelled by request", updated_at=now)
            ).rowcount
            row = conn.execute(select(JOB).where(JOB.c.name == name)).first()
            if row is None:
                return None, False
            if changed and event is not None:
                self._insert_event(conn, replace(event, job_id=row.id), now)
        return job_record(row), bool(changed)

    def live_jobs(self) -> list[JobRecord]:
        """Jobs not yet succeeded, failed or cancelled, oldest first."""
        query = select(JOB).where(JOB.c.state.not_in(_TERMINAL_STATES)).order_by(JOB.c.id)
        with self.engine.connect() as conn:
            return [job_record(row) for row in conn.execute(query)]

    def jobs_page(
        self, *, state: str | None = None, before_id: int | None = None, limit: int = 100
    ) -> list[JobRecord]:
        """Jobs newest first, optionally in one state; page with `before_id`."""
        query = select(JOB).order_by(JOB.c.id.desc()).limit(limit)
        if state is not None:
            query = query.where(JOB.c.state == state)
        if before_id is not None:
            query = query.where(JOB.c.id < before_id)
        with self.engine.connect() as conn:
            return [job_record(row) for row in conn.execute(query)]

    def job_counts(self) -> dict[str, int]:
        """Jobs per state (states with no job left out)."""
        query = select(JOB.c.state, func.count()).group_by(JOB.c.state)
        with self.engine.connect() as conn:
            return {state: int(n) for state, n in conn.execute(query)}

    def policies_in_use(self) -> set[str]:
        """Policy names that live jobs run under."""
        query = select(JOB.c.policy).where(JOB.c.state.not_in(_TERMINAL_STATES)).distinct()
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    # -- policy versions -------------------------------------------------------------------

    def record_policy_changes(
        self,
        versions: Sequence[PolicyVersionRecord],
        events: Sequence[NewEvent] = (),
        *,
        at: datetime | None = None,
    ) -> list[int]:
        """Append what the watcher saw (ids and times are assigned here) with its events."""
        now = self._now(at)
        ids: list[int] = []
        with self.engine.begin() as conn:
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
            for event in events:
                self._insert_event(conn, event, now)
        return ids

    def latest_policy_versions(self) -> dict[str, PolicyVersionRecord]:
        """The newest record of every path the watcher has seen."""
        newest = select(func.max(_VERSION.c.id)).group_by(_VERSION.c.path)
        query = select(_VERSION).where(_VERSION.c.id.in_(newest))
        with self.engine.connect() as conn:
            return {row.path: _version(row) for row in conn.execute(query)}

    def last_loaded_version(self, path: str) -> PolicyVersionRecord | None:
        """The newest version of `path` that loaded: what stays in force while it is broken."""
        query = (
            select(_VERSION)
            .where(_VERSION.c.path == path, _VERSION.c.outcome == "loaded")
            .order_by(_VERSION.c.id.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
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
        with self.engine.connect() as conn:
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
        with self.engine.connect() as conn:
            return [_version(row) for row in conn.execute(query)]

    # -- price signals ---------------------------------------------------------------------

    def price_signals(self) -> dict[str, dict[str, Any]]:
        """Every policy's stored price-signal state (decoded JSON)."""
        with self.engine.connect() as conn:
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
        now = self._now(at)
        with self.engine.begin() as conn:
            conn.execute(delete(_SIGNAL).where(_SIGNAL.c.policy == policy))
            if state is not None:
                values = {"policy": policy, "state": json.dumps(state, sort_keys=True)}
                conn.execute(insert(_SIGNAL).values({**values, "updated_at": now}))
            for event in events:
                self._insert_event(conn, event, now)

    # -- poll status -----------------------------------------------------------------------

    def save_poll_status(self, status: PollStatusRecord, events: Iterable[NewEvent] = ()) -> None:
        """Upsert one (provider, region, market) poll status, with its events."""
        values = {name: getattr(status, name) for name in PollStatusRecord.__dataclass_fields__}
        values["last_run_at"] = aware(status.last_run_at, "last_run_at")
        stmt = dialect_insert(self.engine.dialect.name, _POLL)
        key = ("provider", "region", "market")
        upsert = stmt.on_conflict_do_update(
            index_elements=list(key),
            set_={name: stmt.excluded[name] for name in values if name not in key},
        )
        with self.engine.begin() as conn:
            conn.execute(upsert, [values])
            for event in events:
                self._insert_event(conn, event, values["last_run_at"])

    def poll_statuses(self) -> list[PollStatusRecord]:
        query = select(_POLL).order_by(_POLL.c.provider, _POLL.c.market, _POLL.c.region)
        with self.engine.connect() as conn:
            return [
                PollStatusRecord(
                    **{k: row._mapping[k] for k in PollStatusRecord.__dataclass_fields__}
                )
                for row in conn.execute(query)
            ]

    def offer_counts(self) -> dict[tuple[str, str], int]:
        """Latest offers per (provider, market)."""
        query = select(_LATEST.c.provider, _LATEST.c.market, func.count()).group_by(
            _LATEST.c.provider, _LATEST.c.market
        )
        with self.engine.connect() as conn:
            return {(p, m): int(n) for p, m, n in conn.execute(query)}
