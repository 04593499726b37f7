"""/events and /alerts: what happened, newest first, and the outbox's delivery state."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query

from optimizer import answers
from optimizer.api.params import Id, Page
from optimizer.api.state import StateDep, utc_text
from optimizer.model import event_kind
from optimizer.store import EventRecord

router = APIRouter(tags=["events"])
_STATES = "^(pending|delivered|failed)$"


def event_view(event: EventRecord) -> dict[str, Any]:
    return {
        "id": event.id,
        "at": utc_text(event.at),
        "kind": event.kind,
        "severity": event.severity,
        "job_id": event.job_id,
        "policy": event.policy,
        "message": event.message,
        "data": event.data,
    }


@router.get("/events", response_model=answers.EventList)
def list_events(
    state: StateDep,
    kind: Annotated[
        str | None, Query(description="Only events of this kind (an earlier spelling works too).")
    ] = None,
    job: Annotated[str | None, Query(description="Only this job's events (by name).")] = None,
    policy: str | None = None,
    before: Annotated[Id | None, Query(description="Only events with an id below this.")] = None,
    limit: Annotated[Page, Query()] = 100,
) -> dict[str, Any]:
    """Events newest first; page with `before=<smallest id seen>`."""
    job_id = None
    if job is not None:
        record = state.store.jobs.get_job(job)
        if record is None:
            raise HTTPException(404, detail=f"no job named {job!r}")
        job_id = record.id
    events = state.store.events.list_events(
        kind=None if kind is None else event_kind(kind),
        job_id=job_id,
        policy=policy,
        before_id=before,
        limit=limit,
    )
    return {"events": [event_view(e) for e in events]}


@router.get("/events/{event_id}", response_model=answers.EventView)
def show_event(event_id: Annotated[Id, Path()], state: StateDep) -> dict[str, Any]:
    event = state.store.events.get_event(event_id)
    if event is None:
        raise HTTPException(404, detail=f"no event {event_id}")
    return event_view(event)


@router.get("/alerts", response_model=answers.AlertList)
def list_alerts(
    state: StateDep,
    alert_state: Annotated[str | None, Query(alias="state", pattern=_STATES)] = None,
    limit: Annotated[Page, Query()] = 100,
) -> dict[str, Any]:
    """Outbox rows newest first: channel name, attempts, next attempt, last error."""
    rows = state.store.events.list_alerts(state=alert_state, limit=limit)
    return {
        "counts": state.store.events.alert_counts(),
        "alerts": [
            {
                "id": r["id"],
                "event_id": r["event_id"],
                "channel": r["channel"],
                "dedupe_key": r["dedupe_key"],
                "state": r["state"],
                "attempts": r["attempts"],
                "next_attempt_at": utc_text(r["next_attempt_at"]),  # type: ignore[arg-type]
                "last_error": r["last_error"],
                "created_at": utc_text(r["created_at"]),  # type: ignore[arg-type]
                "delivered_at": utc_text(r["delivered_at"]),  # type: ignore[arg-type]
            }
            for r in rows
        ],
    }
