"""The monthly cost summary alert (`costs.monthly_summary`), from the ledger.

- **Scheduled**: `MonthlySummary`, a step of the reconcile pass (so it runs on the leader, on
  the daemon's clock, after the pass has frozen what ended): on the first pass of a month
  (UTC), normally minutes after midnight on the 1st, it raises last month's summary. A leader
  that was down then raises it on its first pass within the month's first `CATCH_UP_DAYS`
  days. Exactly once per month: the store is asked, in the transaction that would record it,
  whether a scheduled summary of that month was recorded this month already (a restart, or
  another replica after a failover, finds it), and each channel's alert carries the key
  `costs-summary:<month>`, so the outbox keeps one alert per channel whatever happens. A
  month in which nothing billed raises nothing.
- **On demand**: `raise_summary` with `trigger="request"` (`POST /costs/notify`, `gpuopt costs
  --notify`): any window, every time it is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from optimizer.costs.lines import Line
from optimizer.costs.summary import message, month_name, previous_month, summarize
from optimizer.jobs.context import EventDrafter, ReconcileContext
from optimizer.jobs.ledger import Ledger
from optimizer.model import EventKind
from optimizer.store import EventRecord, Store

SCHEDULE = "schedule"
REQUEST = "request"
CATCH_UP_DAYS = 7


def dedupe_key(month: str) -> str:
    """The scheduled summary's fact, one per month: each channel's alert key starts with it."""
    return f"costs-summary:{month}"


def raise_summary(
    store: Store,
    drafter: EventDrafter,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    trigger: str = REQUEST,
    lines: list[Line] | None = None,
) -> tuple[int | None, dict[str, object]]:
    """Record the summary of the lines of the months in [start, end) as an event with its
    alerts. A scheduled one is recorded only if its month's is not there yet (returns None
    for the id then). Returns (event id, the event's data)."""
    if lines is None:
        lines = Ledger(store).lines(since=start, until=end, now=now)
    data = summarize(lines, start, end, trigger=trigger)
    month = str(data["month"])
    event = drafter.draft(
        EventKind.COSTS_MONTHLY_SUMMARY,
        message(data),
        data=data,
        dedupe_key=dedupe_key(month) if trigger == SCHEDULE else None,
    )
    if trigger != SCHEDULE:
        return store.events.add_events([event], at=now)[0], data

    return store.events.record_once(event, since=end, same=scheduled(month), at=now), data


def scheduled(month: str) -> Callable[[EventRecord], bool]:
    """Whether a recorded summary is the scheduled one of `month`."""

    def same(recorded: EventRecord) -> bool:
        data = recorded.data or {}
        return data.get("month") == month and data.get("trigger") == SCHEDULE

    return same


class MonthlySummary:
    """The reconcile pass's step that raises last month's summary once (see the module)."""

    name = "costs-summary"

    def __init__(self) -> None:
        self._done: str | None = None  # the month this process saw raised (or empty)

    def __call__(self, ctx: ReconcileContext) -> None:
        start, end = previous_month(ctx.now)
        month = month_name(start)
        if self._done == month or ctx.now.astimezone(UTC).day > CATCH_UP_DAYS:
            return
        raised = scheduled(month)
        if any(raised(e) for e in ctx.store.events.of_kind(EventKind.COSTS_MONTHLY_SUMMARY, end)):
            self._done = month
            return
        lines = Ledger(ctx.store).lines(since=start, until=end, now=ctx.now)
        if lines:
            raise_summary(
                ctx.store, ctx.emitter, start, end, ctx.now, trigger=SCHEDULE, lines=lines
            )
        self._done = month


__all__ = ["CATCH_UP_DAYS", "REQUEST", "SCHEDULE", "MonthlySummary", "dedupe_key", "raise_summary"]
