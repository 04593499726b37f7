"""Events and the alert outbox: every alert row is written in its event's transaction.

`write_events(conn, events, at)` is how any repository records the events a change causes:
on the caller's connection, so a job transition (jobs.py) or a policy change (policies.py)
commits with its events and their outbox rows, or not at all. Events are numbered and timed
in commit order (`_insert_event`), so the outbox delivers them in that order. Whoever
`Events.listen`s is told each transaction's events once it has committed (the daemon logs
jobs' events so).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Insert,
    Select,
    and_,
    func,
    insert,
    or_,
    select,
    text,
    update,
)

from optimizer.store.engine import (
    Database,
    EventListener,
    aware,
    dialect_insert,
    event_record,
    inserted_id,
    note_event,
    table,
)
from optimizer.store.records import EventRecord, NewEvent, OutboxItem, given_name
from optimizer.store.tables import AlertOutbox, Event, Job

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
ALERT_STATES = (PENDING, DELIVERED, FAILED)
_ERROR_CHARS = 500  # enough to read the cause; a receiver's whole HTML error page is not

_EVENT = table(Event)
_JOB = table(Job)
_OUTBOX = table(AlertOutbox)


def _event_row(
    at: datetime,
    kind: str,
    message: str,
    severity: str,
    job_id: int | None,
    policy: str | None,
    data: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {
        "at": at,
        "kind": kind,
        "severity": severity,
        "job_id": job_id,
        "policy": policy,
        "message": message,
        "data": None if data is None else json.dumps(dict(data), sort_keys=True),
    }


@functools.cache
def _outbox_insert(dialect: str) -> Insert:
    # A repeated dedupe key means the alert was raised already: keep the first.
    return dialect_insert(dialect, _OUTBOX).on_conflict_do_nothing(index_elements=["dedupe_key"])


# PostgreSQL: the transaction-level advisory lock every event write takes just before its
# insert, held to its commit (one key per database and schema, as the leader's lock).
_EVENT_ORDER_LOCK = text(
    "SELECT pg_advisory_xact_lock(hashtextextended("
    "'gpuopt-events:' || current_database() || '/' || current_schema(), 0))"
)


def commit_time(conn: Connection, at: datetime) -> datetime:
    """The time an event written now on this transaction records: `at` or, when later, the
    last committed event's. It waits first for any other transaction that has written an
    event to end (on PostgreSQL the advisory lock below, held to the commit and taken again
    at no cost by the same transaction; on SQLite the database's one writer, which a
    transaction holds from its first write), so the time read is final. A transaction that
    ends attempts with its events takes their time from here too (`Jobs.transition_job`)."""
    if conn.dialect.name == "postgresql":
        conn.execute(_EVENT_ORDER_LOCK)
    before = conn.execute(select(_EVENT.c.at).order_by(_EVENT.c.id.desc()).limit(1)).scalar()
    if before is not None and aware(before, "at") > at:
        return aware(before, "at")
    return at


def _insert_event(
    conn: Connection,
    at: datetime,
    kind: str,
    message: str,
    severity: str,
    job_id: int | None,
    policy: str | None,
    data: Mapping[str, Any] | None,
) -> tuple[int, datetime]:
    """Insert one event row, noted for the store's event listeners (told after the commit);
    returns its id and its time.

    Events are numbered and timed in commit order, so whoever reads them by id or by time
    (the outbox, the event log, a reader that pages on) sees each commit add events after
    every one it has seen, never before. The insert waits for any other transaction that
    has written an event to end (on PostgreSQL an advisory lock taken here, held to the
    commit; on SQLite the database's one writer), so ids follow the commits; and the time is
    `at` or, when later, the last committed event's: a transaction that took its time before
    another one committed records its events after that one's, not before."""
    at = commit_time(conn, at)
    row = _event_row(at, kind, message, severity, job_id, policy, data)
    event_id = inserted_id(conn.execute(insert(_EVENT).values(row)))
    plain = None if data is None else json.loads(row["data"])
    note_event(conn, EventRecord(event_id, at, kind, severity, job_id, policy, message, plain))
    return event_id, at


def write_event(conn: Connection, event: NewEvent, at: datetime) -> int:
    """Write the event and one outbox row per alert channel, on the caller's transaction
    (the event's time, and its alerts', may come out later than `at`: see `_insert_event`)."""
    event_id, at = _insert_event(
        conn, at, event.kind, event.message, event.severity, event.job_id, event.policy, event.data
    )
    if event.alerts:
        base = event.dedupe_key or f"event:{event_id}"
        rows = [
            {
                "event_id": event_id,
                "channel": channel,
                "dedupe_key": f"{base}#{channel}",
                "state": PENDING,
                "attempts": 0,
                "next_attempt_at": at,
                "last_error": None,
                "created_at": at,
                "updated_at": at,
                "delivered_at": None,
            }
            for channel in dict.fromkeys(event.alerts)
        ]
        conn.execute(_outbox_insert(conn.dialect.name), rows)
    return event_id


def write_events(conn: Connection, events: Iterable[NewEvent], at: datetime) -> list[int]:
    """`write_event` for each, in order; returns the event ids."""
    return [write_event(conn, event, at) for event in events]


class Events:
    """Event writes with alerts, event queries for the API, and the outbox's bookkeeping."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- events ----------------------------------------------------------------------------

    def listen(self, listener: EventListener) -> None:
        """Tell `listener` the events of every transaction of this store that records some,
        after it commits, on the writer's thread (the daemon's log of job events)."""
        self._db.event_listeners.append(listener)

    def unlisten(self, listener: EventListener) -> None:
        if listener in self._db.event_listeners:
            self._db.event_listeners.remove(listener)

    def add_event(
        self,
        kind: str,
        message: str,
        *,
        severity: str = "info",
        job_id: int | None = None,
        policy: str | None = None,
        data: Mapping[str, Any] | None = None,
        at: datetime | None = None,
    ) -> int:
        """Record an event of any kind, without alerts, and return its id."""
        now = self._db.now(at)
        with self._db.begin() as conn:
            return _insert_event(conn, now, kind, message, severity, job_id, policy, data)[0]

    def add_events(self, events: Sequence[NewEvent], *, at: datetime | None = None) -> list[int]:
        """Record events and their alerts in one transaction; returns the event ids."""
        now = self._db.now(at)
        with self._db.begin() as conn:
            return write_events(conn, events, now)

    def record_event(self, event: NewEvent, *, at: datetime | None = None) -> int:
        """Record one event and its alerts in one transaction; returns its id."""
        return self.add_events([event], at=at)[0]

    def record_events(self, events: Iterable[NewEvent], at: datetime) -> None:
        """Record events and their alerts in one transaction, at `at`."""
        self.add_events(list(events), at=at)

    def of_kind(self, kind: str, since: datetime) -> list[EventRecord]:
        """Events of one kind recorded at or after `since`, oldest first."""
        with self._db.connect() as conn:
            return [event_record(row) for row in conn.execute(self._of_kind(kind, since))]

    def record_once(
        self,
        event: NewEvent,
        *,
        since: datetime,
        same: Callable[[EventRecord], bool],
        at: datetime | None = None,
    ) -> int | None:
        """Record the event and its alerts unless an event of its kind recorded at or after
        `since` is `same` as it; the check and the write are one transaction. Returns the new
        event's id, or None when one was there already."""
        now = self._db.now(at)
        with self._db.begin() as conn:
            found = conn.execute(self._of_kind(event.kind, since))
            if any(same(event_record(row)) for row in found):
                return None
            return write_event(conn, event, now)

    @staticmethod
    def _of_kind(kind: str, since: datetime) -> Select[Any]:
        return (
            select(_EVENT)
            .where(_EVENT.c.kind == kind, _EVENT.c.at >= aware(since, "since"))
            .order_by(_EVENT.c.at, _EVENT.c.id)
        )

    def get_event(self, event_id: int) -> EventRecord | None:
        with self._db.connect() as conn:
            row = conn.execute(select(_EVENT).where(_EVENT.c.id == event_id)).first()
        return None if row is None else event_record(row)

    def recent(self, job_id: int | None = None, limit: int = 100) -> list[EventRecord]:
        """The newest `limit` events (of one job, if given), returned oldest first."""
        query = select(_EVENT).order_by(_EVENT.c.at.desc(), _EVENT.c.id.desc()).limit(limit)
        if job_id is not None:
            query = query.where(_EVENT.c.job_id == job_id)
        with self._db.connect() as conn:
            rows = conn.execute(query).all()
        return [event_record(row) for row in reversed(rows)]

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
        query = select(_EVENT).order_by(_EVENT.c.id.desc()).limit(limit)
        if kind is not None:
            query = query.where(_EVENT.c.kind == kind)
        if job_id is not None:
            query = query.where(_EVENT.c.job_id == job_id)
        if policy is not None:
            query = query.where(_EVENT.c.policy == policy)
        if before_id is not None:
            query = query.where(_EVENT.c.id < before_id)
        with self._db.connect() as conn:
            return [event_record(row) for row in conn.execute(query)]

    # -- outbox ----------------------------------------------------------------------------

    def due_alerts(self, now: datetime, limit: int = 50) -> list[OutboxItem]:
        """Pending alerts to send now, with their events, oldest (raised) first. An alert that
        is not due yet (waiting out its back-off) holds back every later one to its channel,
        so each receiver gets its alerts in the order they were raised; other channels are
        not held up."""
        now = aware(now, "now")
        earlier = _OUTBOX.alias("earlier")
        held_back = (
            select(earlier.c.id)
            .where(
                earlier.c.channel == _OUTBOX.c.channel,
                earlier.c.state == PENDING,
                earlier.c.next_attempt_at > now,
                or_(
                    earlier.c.created_at < _OUTBOX.c.created_at,
                    and_(
                        earlier.c.created_at == _OUTBOX.c.created_at,
                        earlier.c.id < _OUTBOX.c.id,
                    ),
                ),
            )
            .exists()
        )
        due = (
            select(_OUTBOX)
            .where(_OUTBOX.c.state == PENDING, _OUTBOX.c.next_attempt_at <= now, ~held_back)
            .order_by(_OUTBOX.c.created_at, _OUTBOX.c.id)
            .limit(limit)
        )
        with self._db.connect() as conn:
            rows = conn.execute(due).all()
            ids = {row.event_id for row in rows}
            events = (
                conn.execute(
                    select(_EVENT, _JOB.c.name.label("job_name"))
                    .outerjoin(_JOB, _JOB.c.id == _EVENT.c.job_id)
                    .where(_EVENT.c.id.in_(ids))
                ).all()
                if ids
                else []
            )
        found = {
            row.id: (event_record(row), None if row.job_name is None else given_name(row.job_name))
            for row in events
        }
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
            update(_OUTBOX)
            .where(_OUTBOX.c.id == alert_id, _OUTBOX.c.state == PENDING)
            .values(**values)
        )
        with self._db.begin() as conn:
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

    def alert_backlog(self) -> dict[str, tuple[int, datetime]]:
        """Per channel with pending alerts: how many, and when the oldest was raised."""
        query = (
            select(_OUTBOX.c.channel, func.count(), func.min(_OUTBOX.c.created_at))
            .where(_OUTBOX.c.state == PENDING)
            .group_by(_OUTBOX.c.channel)
        )
        with self._db.connect() as conn:
            return {
                channel: (int(count), oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC))
                for channel, count, oldest in conn.execute(query)
            }

    def alert_counts(self) -> dict[str, int]:
        """Outbox rows per state, every state present."""
        query = select(_OUTBOX.c.state, func.count()).group_by(_OUTBOX.c.state)
        counts = dict.fromkeys(ALERT_STATES, 0)
        with self._db.connect() as conn:
            counts.update({state: int(n) for state, n in conn.execute(query)})
        return counts

    def list_alerts(self, *, state: str | None = None, limit: int = 100) -> list[dict[str, object]]:
        """Outbox rows newest first, for people: no payloads, no channel settings."""
        query = select(_OUTBOX).order_by(_OUTBOX.c.id.desc()).limit(limit)
        if state is not None:
            query = query.where(_OUTBOX.c.state == state)
        with self._db.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]
