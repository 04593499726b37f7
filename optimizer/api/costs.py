"""/costs: the cost ledger's lines grouped by job, policy, provider, market or month.

The JSON is `optimizer.costs.report.report`: one object per group with its spend, storage,
on-demand baseline, savings, billed and overhead time (docs/costs.md), and, grouped by job,
each attempt. `gpuopt costs --json` prints the same list.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from optimizer import answers
from optimizer.api.state import ApiState, StateDep, utc_text
from optimizer.costs import GroupBy, Line
from optimizer.costs.focus import write_csv
from optimizer.costs.ledger import month_windows
from optimizer.costs.lines import totals_by
from optimizer.costs.report import TimeError, line_figures, parse_time, report
from optimizer.costs.summary import message, months, previous_month
from optimizer.jobs.gang import head_number
from optimizer.jobs.ledger import Filters, Ledger, attempt_role
from optimizer.jobs.summary import REQUEST, raise_summary
from optimizer.model import EventKind, Market

router = APIRouter(tags=["costs"])

Format = Literal["json", "focus"]
CSV_TYPE = "text/csv; charset=utf-8"

_TIME = "A month (2026-03), a date (2026-03-14) or an ISO 8601 time; UTC unless it says."


def _window(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    try:
        return (
            None if since is None else parse_time(since, "since"),
            None if until is None else parse_time(until, "until"),
        )
    except TimeError as exc:
        raise HTTPException(422, detail=str(exc)) from None


@router.get(
    "/costs",
    response_model=list[answers.CostGroup],
    responses={200: {"content": {"text/csv": {}}, "description": "JSON, or FOCUS CSV"}},
)
def costs(
    state: StateDep,
    by: Annotated[GroupBy, Query(description="Group the lines by this.")] = GroupBy.JOB,
    since: Annotated[
        str | None, Query(description=f"Lines of the months ending after this. {_TIME}")
    ] = None,
    until: Annotated[
        str | None, Query(description=f"Lines of the months starting before this. {_TIME}")
    ] = None,
    job: Annotated[str | None, Query(description="Only this job's lines (by name).")] = None,
    policy: Annotated[str | None, Query(description="Only this policy's lines.")] = None,
    provider: Annotated[str | None, Query(description="Only this provider's lines.")] = None,
    market: Annotated[Market | None, Query(description="Only this market's lines.")] = None,
    fmt: Annotated[
        Format,
        Query(
            alias="format",
            description="json (the groups), or focus: the lines as a FinOps FOCUS 1.1 CSV.",
        ),
    ] = "json",
) -> Any:
    """What the attempts cost, per group: a list of objects (`group`, `spend_usd`,
    `storage_usd`, `total_usd`, `on_demand_usd`, `savings_usd`, `savings_fraction`,
    `net_savings_fraction`, `billed_seconds`, `overhead_seconds`, `overhead_usd`,
    `baseline_known`, `attempt_count`, `markets`: the same figures per market, and with
    `by=job` the `attempts`). A line is one
    attempt in one calendar month (UTC); `since`/`until` select the months they overlap.
    With `format=focus`, the selected lines as a FOCUS 1.1 CSV (text/csv; `by` is ignored)."""
    start, end = _window(since, until)
    if job is not None and state.store.jobs.get_job(job) is None:
        raise HTTPException(404, detail=f"no job named {job!r}")
    ledger = Ledger(state.store, state.clock)
    filters: Filters = {
        "since": start,
        "until": end,
        "job": job,
        "policy": policy,
        "provider": provider,
        "market": None if market is None else market.value,
    }
    if fmt == "focus":
        return Response(write_csv(ledger.lines(**filters)), media_type=CSV_TYPE)
    if by is GroupBy.JOB:
        lines = ledger.lines(**filters)
        return report(totals_by(lines, by, markets=True), lines)
    return report(ledger.groups(by, markets=True, **filters))


def job_attempts(state: ApiState, job_id: int) -> list[dict[str, Any]]:
    """A job's attempts in number order, each with its cost lines (one per month it billed
    in; none for an attempt that never got an instance). Read by `GET /jobs/{name}`."""
    lines: dict[tuple[int, str | None], list[Line]] = {}
    for line in Ledger(state.store, state.clock).lines(job_id=job_id):
        # A multi-node attempt's lines share its number: each node's row takes its instance's.
        lines.setdefault((line.attempt, line.instance_id), []).append(line)
    return [
        {
            "number": a.number,
            # A node of a multi-node attempt: the attempt (rank 0's number), rank and size.
            "gang": a.gang,
            "node_rank": a.node_rank,
            "nodes": a.nodes,
            "provider": a.provider,
            "region": a.region,
            "zone": a.zone,
            "instance_type": a.instance_type,
            "market": a.market,
            "usd_per_hour": a.usd_per_hour,
            "instance_id": a.instance_id,
            "state": a.state,
            "end_reason": a.end_reason,
            "started_at": utc_text(a.started_at),
            "ended_at": utc_text(a.ended_at),
            "launched_at": utc_text(a.launched_at),
            "terminated_at": utc_text(a.terminated_at),
            "terminated_by": a.terminated_by,
            "role": attempt_role(a),
            "promoted_at": utc_text(a.promoted_at),
            "registered_at": utc_text(a.registered_at),
            "probe_status": a.probe_status,
            "cost_lines": [
                {
                    "month": line.month,
                    "period_start": utc_text(line.period_start),
                    "period_end": utc_text(line.period_end),
                    "frozen": line.frozen,
                    "refunded": line.cost.refunded,
                    **line_figures([line]),
                }
                for line in lines.get((head_number(a.number, a.gang), a.instance_id), [])
            ],
        }
        for a in state.store.jobs.attempts(job_id)
    ]


@router.post("/costs/notify", response_model=answers.CostNotice)
def notify(
    state: StateDep,
    since: Annotated[
        str | None,
        Query(description=f"The first month summarized (default: last month). {_TIME}"),
    ] = None,
    until: Annotated[
        str | None,
        Query(description=f"The month after the last one summarized (default: since's). {_TIME}"),
    ] = None,
) -> dict[str, Any]:
    """Raise the cost summary alert now (kind `costs.monthly_summary`, routed like every
    event): last month's by default, or the whole months [since, until) overlap. Answers the
    event's id, the channels its alert goes to, its message and its data."""
    now = state.clock()
    start, end = _window(since, until)
    if start is None and end is not None:
        raise HTTPException(422, detail="until: give since too")
    if start is None:
        start, end = previous_month(now)
    elif end is None:
        end = month_windows(start, start + timedelta(microseconds=1))[0][1]
    if end <= start:
        raise HTTPException(422, detail="until: must be after since")
    start, end = months(start, end)
    event_id, data = raise_summary(state.store, state.emitter, start, end, now, trigger=REQUEST)
    kind = EventKind.COSTS_MONTHLY_SUMMARY
    return {
        "event_id": event_id,
        "channels": list(state.emitter.router.channels_for(kind, "info")),
        "message": message(data),
        "data": data,
    }
