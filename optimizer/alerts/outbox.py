"""Raising alerts and pacing their retries.

`Emitter` is how the daemon records an event: routing picks the channels, and the event
and one outbox row per channel are written in one transaction, so an alert exists exactly
when its event does. `backoff` paces failed deliveries.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from optimizer.alerts.config import RetryConfig
from optimizer.alerts.routing import Router
from optimizer.common.retry import backoff_delay
from optimizer.model import EventKind
from optimizer.store import NewEvent


class EventSink(Protocol):
    def add_events(
        self, events: Sequence[NewEvent], *, at: datetime | None = None
    ) -> list[int]: ...


class Emitter:
    """Builds events with their alert channels and records them."""

    def __init__(self, sink: EventSink, router: Router) -> None:
        self._sink = sink
        self.router = router

    def draft(
        self,
        kind: EventKind,
        message: str,
        *,
        severity: str = "info",
        policy: str | None = None,
        job_id: int | None = None,
        data: Mapping[str, Any] | None = None,
        dedupe_key: str | None = None,
    ) -> NewEvent:
        """An event routed to its channels, not yet recorded (for a caller's transaction)."""
        return NewEvent(
            kind=kind,
            message=message,
            severity=severity,
            job_id=job_id,
            policy=policy,
            data=data,
            alerts=self.router.channels_for(kind, severity),
            dedupe_key=dedupe_key,
        )

    def emit(
        self,
        kind: EventKind,
        message: str,
        *,
        severity: str = "info",
        policy: str | None = None,
        job_id: int | None = None,
        data: Mapping[str, Any] | None = None,
        dedupe_key: str | None = None,
    ) -> int:
        """Record an event and its alerts now; returns the event id."""
        event = self.draft(
            kind,
            message,
            severity=severity,
            policy=policy,
            job_id=job_id,
            data=data,
            dedupe_key=dedupe_key,
        )
        return self._sink.add_events([event])[0]


def backoff(attempts: int, retry: RetryConfig, rng: random.Random) -> timedelta:
    """The wait after the `attempts`-th failure: `optimizer.common.retry.backoff_delay` with
    the config's base and cap, so in [d/2, d] for d = base x 2^(attempts-1), capped."""
    return timedelta(
        seconds=backoff_delay(attempts, base=retry.base_s, cap=retry.max_s, rng=rng.random)
    )


def give_up(attempts: int, created_at: datetime, now: datetime, retry: RetryConfig) -> bool:
    """True once an alert has used its attempts or is older than max_age_hours."""
    too_old = now - created_at >= timedelta(hours=retry.max_age_hours)
    return attempts >= retry.max_attempts or too_old
