"""The outbox in the store, on SQLite and PostgreSQL: one transaction with the event,
deduplicated by key, due alerts oldest first, and bookkeeping only from `pending`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from optimizer.store import NewEvent, Store
from optimizer.store import events as store_events
from tests.helpers import T0

pytestmark = pytest.mark.usefixtures("daemon_env")


def alert(kind: str = "price.dropped", *, key: str | None = None, channels=("ops",)) -> NewEvent:
    return NewEvent(kind, f"{kind} happened", alerts=tuple(channels), dedupe_key=key)


def test_an_event_and_its_alerts_are_written_together(store: Store) -> None:
    event_id = store.events.record_event(alert(channels=("ops", "pager")), at=T0)
    due = store.events.due_alerts(T0)
    assert [(a.channel, a.event.id, a.event.kind) for a in due] == [
        ("ops", event_id, "price.dropped"),
        ("pager", event_id, "price.dropped"),
    ]
    assert [a.dedupe_key for a in due] == [f"event:{event_id}#ops", f"event:{event_id}#pager"]


def test_a_failed_alert_write_leaves_no_event_behind(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(dialect: str) -> None:
        raise RuntimeError("outbox unavailable")

    monkeypatch.setattr(store_events, "_outbox_insert", broken)
    with pytest.raises(RuntimeError):
        store.events.record_event(alert(), at=T0)
    assert store.events.list_events() == []


def test_a_job_transition_and_its_alerts_commit_together(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = store.jobs.add_job("train", "small", {"run": "x"}, at=T0)
    working = store_events._outbox_insert

    def broken(dialect: str) -> None:
        raise RuntimeError("outbox unavailable")

    monkeypatch.setattr(store_events, "_outbox_insert", broken)
    with pytest.raises(RuntimeError):
        store.jobs.transition_job(
            job_id,
            expected="pending",
            state="failed",
            reason="r",
            events=[alert("job.failed")],
            at=T0,
        )
    assert store.jobs.get_job("train").state == "pending"  # type: ignore[union-attr]
    assert store.events.list_events() == []
    monkeypatch.setattr(store_events, "_outbox_insert", working)
    store.jobs.transition_job(
        job_id, expected="pending", state="failed", reason="r", events=[alert("x")], at=T0
    )
    assert store.jobs.get_job("train").state == "failed"  # type: ignore[union-attr]
    assert [a.event.job_id for a in store.events.due_alerts(T0)] == [job_id]


def test_the_same_dedupe_key_raises_one_alert(store: Store) -> None:
    store.events.record_event(alert(key="drop:1"), at=T0)
    store.events.record_event(alert(key="drop:1"), at=T0)
    store.events.record_event(alert(key="drop:2"), at=T0)
    assert [a.dedupe_key for a in store.events.due_alerts(T0)] == ["drop:1#ops", "drop:2#ops"]
    assert len(store.events.list_events()) == 3  # the events are facts; the alert is raised once


def test_due_alerts_come_in_commit_order_with_the_job_name(store: Store) -> None:
    job_id = store.jobs.add_job("train", "small", {"run": "x"}, at=T0)
    store.events.record_event(NewEvent("first", "m", job_id=job_id, alerts=("ops",)), at=T0)
    store.events.record_event(alert("second"), at=T0 + timedelta(minutes=5))
    assert [a.event.kind for a in store.events.due_alerts(T0)] == ["first"]
    due = store.events.due_alerts(T0 + timedelta(minutes=5))
    assert [(a.event.kind, a.job_name) for a in due] == [("first", "train"), ("second", None)]
    # A time taken before the last commit: recorded after it, at its time, not before it.
    store.events.record_event(alert("backdated"), at=T0 + timedelta(minutes=1))
    due = store.events.due_alerts(T0 + timedelta(minutes=5))
    assert [a.event.kind for a in due] == ["first", "second", "backdated"]
    assert due[-1].created_at == due[-1].event.at == T0 + timedelta(minutes=5)


def test_bookkeeping_moves_alerts_on_from_pending_only(store: Store) -> None:
    store.events.record_event(alert(key="a"), at=T0)
    store.events.record_event(alert(key="b"), at=T0)
    first, second = store.events.due_alerts(T0)
    later = T0 + timedelta(seconds=30)
    assert store.events.alert_retry(
        first.id, attempts=1, next_attempt_at=later, error="HTTP 503", at=T0
    )
    assert store.events.due_alerts(T0) == []  # held back behind the first: one channel
    assert [a.id for a in store.events.due_alerts(later)] == [first.id, second.id]
    assert store.events.alert_delivered(second.id, attempts=1, at=T0)
    assert not store.events.alert_retry(
        second.id, attempts=2, next_attempt_at=later, error="x", at=T0
    )
    assert store.events.alert_failed(first.id, attempts=2, error="HTTP 500 " + "x" * 2000, at=later)
    assert not store.events.alert_delivered(first.id, attempts=3, at=later)
    assert store.events.alert_counts() == {"pending": 0, "delivered": 1, "failed": 1}
    failed = store.events.list_alerts(state="failed")[0]
    assert failed["attempts"] == 2 and len(failed["last_error"]) == 500
