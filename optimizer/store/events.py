"""Events and the alert outbox: every alert row is written in its event's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select, update

from optimizer.store.engine import EVENT, JOB, OUTBOX, StoreBase, aware, event_record
from optimizer.store.tables import EventRecord, NewEvent, OutboxItem

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
ALERT_STATES = (PENDING, DELIVERED, FAILED)
_ERROR_CHARS = 500  # enough to read the cause; a receiver's whole HTML error page is not


class OutboxMixin(StoreBase):
    """Event writes with alerts, event queries for the API, and the outbox's bookkeeping."""

    def add_events(self, events: Sequence[NewEvent], *, at: datetime | None = None) -> list[int]:
        """Record events and their alerts in one transaction; returns the event ids."""
        now = self._now(at)
        with self.engine.begin() as conn:
            return [self._insert_event(conn, event, now) for event in events]

    def record_event(self, event: NewEvent, *, at: datetime | None = None) -> int:
        """Record one event and its alerts in one transaction; returns its id."""
        return self.add_events([event], at=at)[0]

    def get_event(self, event_id: int) -> EventRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(EVENT).where(EVENT.c.id == event_id)).first()
        return None if row is None else event_record(row)

    def list_events(
        self,
        *,
        kind: str | None = None,
        job_id: int | None = None,
        policy: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[EventRecord]:
        """Events newest first, optionally filtered; page with `before_id`."""
        query = select(EVENT).order_by(EVENT.c.id.desc()).limit(limit)
        if kind is not None:
            query = query.where(EVENT.c.kind == kind)
        if job_id is not None:
            query = query.where(EVENT.c.job_id == job_id)
        if policy is not None:
            query = query.where(EVENT.c.policy == policy)
        if before_id is not None:
            query = query.where(EVENT.c.id < before_id)
        with self.engine.connect() as conn:
            return [event_record(row) for row in conn.execute(query)]

    # -- outbox ----------------------------------------------------------------------------

    def due_alerts(self, now: datetime, limit: int = 50) -> list[OutboxItem]:
        """Pending alerts whose next attempt is due, oldest first, with their events."""
        due = (
            select(OUTBOX)
            .where(OUTBOX.c.state == PENDING, OUTBOX.c.next_attempt_at <= aware(now, "now"))
            .order_by(OUTBOX.c.next_attempt_at, OUTBOX.c.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(due).all()
            ids = {row.event_id for row in rows}
            events = (
                conn.execute(
                    select(EVENT, JOB.c.name.label("job_name"))
                    .outerjoin(JOB, JOB.c.id == EVENT.c.job_id)
                    .where(EVENT.c.id.in_(ids))
                ).all()
                if ids
                else []
            )
        found = {row.id: (event_record(row), row.job_name) for row in events}
        return [
            OutboxItem(
                id=row.id,
                channel=row.channel,
                dedupe_key=row.dedupe_key,
                attempts=row.attempts,
                created_at=row.created_at,
                event=found[row.event_id][0],
                job_name=found[row.event_id][1],
            )
            for row in rows
        ]

    def _settle(self, alert_id: int, values: dict[str, object]) -> bool:
        stmt = (
            update(OUTBOX)
            .where(OUTBOX.c.id == alert_id, OUTBOX.c.state == PENDING)
            .values(**values)
        )
        with self.engine.begin() as conn:
            return bool(conn.execute(stmt).rowcount)

    def alert_delivered(self, alert_id: int, *, attempts: int, at: datetime) -> bool:
        """Mark a pending alert delivered; False if it was not pending."""
        at = aware(at, "at")
        return self._settle(
            alert_id,
            {"state": DELIVERED, "attempts": attempts, "delivered_at": at, "updated_at": at},
        )

    def alert_retry(
        self, alert_id: int, *, attempts: int, next_attempt_at: datetime, error: str, at: datetime
    ) -> bool:
        """Record a failed attempt and when to try again."""
        return self._settle(
            alert_id,
            {
                "attempts": attempts,
                "next_attempt_at": aware(next_attempt_at, "next_attempt_at"),
                "last_error": error[:_ERROR_CHARS],
                "updated_at": aware(at, "at"),
            },
        )

    def alert_failed(self, alert_id: int, *, attempts: int, error: str, at: datetime) -> bool:
        """Give up on an alert: it stays in the outbox as `failed` with the last error."""
        return self._settle(
            alert_id,
            {
                "state": FAILED,
                "attempts": attempts,
                "last_error": error[:_ERROR_CHARS],
                "updated_at": aware(at, "at"),
            },
        )

    def alert_counts(self) -> dict[str, int]:
        """Outbox rows per state, every state present."""
        query = select(OUTBOX.c.state, func.count()).group_by(OUTBOX.c.state)
        counts = dict.fromkeys(ALERT_STATES, 0)
        with self.engine.connect() as conn:
            counts.update({state: int(n) for state, n in conn.execute(query)})
        return counts

    def list_alerts(self, *, state: str | None = None, limit: int = 100) -> list[dict[str, object]]:
        """Outbox rows newest first, for people: no payloads, no channel settings."""
        query = select(OUTBOX).order_by(OUTBOX.c.id.desc()).limit(limit)
        if state is not None:
            query = query.where(OUTBOX.c.state == state)
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]
