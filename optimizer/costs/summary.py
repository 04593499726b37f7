"""A period's cost summary (pure): what the monthly summary alert says and carries.

`summarize(lines, start, end)` gives the alert's `data`: the period, its spend (instances,
root volumes, both), the on-demand baseline and the savings against it, gross and net of
overhead, and the top jobs by spend; `message(data)` is its one line for people. The figures
are the ledger's (`optimizer/costs/report.py`), so they agree with `gpuopt costs` over the
same window.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from optimizer.common.jobnames import job_label
from optimizer.costs.ledger import month_windows
from optimizer.costs.lines import GroupBy, Line, group_lines
from optimizer.costs.report import line_figures, utc_text

TOP_JOBS = 5


def previous_month(now: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) before `now`'s, as [start, end)."""
    now = now.astimezone(UTC)
    end = datetime(now.year, now.month, 1, tzinfo=UTC)
    start = datetime(end.year - (end.month == 1), (end.month - 2) % 12 + 1, 1, tzinfo=UTC)
    return start, end


def month_name(start: datetime) -> str:
    """`2026-02` for a period starting on 2026-02-01."""
    return f"{start.year:04d}-{start.month:02d}"


def months(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """The whole calendar months (UTC) that [start, end) touches, as [first's start, end)."""
    windows = month_windows(start, end)
    if not windows:
        first = month_windows(start, start + timedelta(microseconds=1))[0]
        return first
    return windows[0][0], windows[-1][1]


def period_names(start: datetime, end: datetime) -> tuple[str, str]:
    """(`2026-02`, `February 2026`) for one month; (`2026-01/2026-03`, `January 2026 to
    March 2026`) for several (both ends included); ISO times for a window not in months."""
    windows = month_windows(start, end)
    if not windows or windows[0][0] != start or windows[-1][1] != end:
        return f"{utc_text(start)}/{utc_text(end)}", f"{utc_text(start)} to {utc_text(end)}"
    first, last = windows[0][0], windows[-1][0]
    words = f"{calendar.month_name[first.month]} {first.year}"
    if first == last:
        return month_name(first), words
    return (
        f"{month_name(first)}/{month_name(last)}",
        f"{words} to {calendar.month_name[last.month]} {last.year}",
    )


def summarize(
    lines: Sequence[Line],
    start: datetime,
    end: datetime,
    *,
    top: int = TOP_JOBS,
    trigger: str = "schedule",
) -> dict[str, Any]:
    """The summary of `lines` (those of the months in [start, end)) as the alert's data."""
    totals = line_figures(lines)
    # net of the overhead of the same lines as the savings (those with a known baseline)
    fraction = totals["net_savings_fraction"]
    net = fraction * totals["on_demand_usd"] if fraction is not None else None
    jobs = sorted(
        group_lines(lines, GroupBy.JOB),
        key=lambda g: (-g.cost.total_usd, g.key),
    )
    top_jobs = []
    for group in jobs[:top]:
        figures_of = line_figures(group.lines)
        top_jobs.append(
            {
                "job": job_label(group.key),
                "total_usd": figures_of["total_usd"],
                "spend_usd": figures_of["spend_usd"],
                "savings_usd": figures_of["savings_usd"],
                "savings_fraction": figures_of["savings_fraction"],
                "attempts": len({line.attempt for line in group.lines}),
            }
        )
    month, period = period_names(start, end)
    return {
        "month": month,
        "period": period,
        "period_start": utc_text(start),
        "period_end": utc_text(end),
        "trigger": trigger,
        **totals,
        "net_savings_usd": net,
        "jobs": len(jobs),
        "attempts": len({(line.job_id, line.attempt) for line in lines}),
        "top_jobs": top_jobs,
    }


def usd(value: float) -> str:
    return f"${value:,.2f}"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def savings_text(data: Mapping[str, Any]) -> str:
    """`$2,000.00 saved against $3,200.00 on-demand: 62% gross, 57% net of $160.00 overhead`."""
    if data.get("savings_fraction") is None:
        return "no on-demand price known for these instance types, so no savings figure"
    note = "" if data.get("baseline_known", True) else " (attempts without one left out)"
    return (
        f"{usd(data['savings_usd'])} saved against {usd(data['on_demand_usd'])} on-demand"
        f"{note}: {percent(data['savings_fraction'])} gross, "
        f"{percent(data['net_savings_fraction'])} net of {usd(data['overhead_usd'])} overhead"
    )


def top_jobs_text(jobs: Iterable[Mapping[str, Any]]) -> str:
    """`train-a $500.00, train-b $300.00`."""
    return ", ".join(f"{job['job']} {usd(job['total_usd'])}" for job in jobs) or "none"


def message(data: Mapping[str, Any]) -> str:
    """The alert's one line for people."""
    spend = (
        f"{usd(data['total_usd'])} spent (instances {usd(data['spend_usd'])}, root volumes "
        f"{usd(data['storage_usd'])}) on {data['attempts']} attempt(s) of {data['jobs']} job(s)"
    )
    if not data["attempts"]:
        return f"{data['period']}: nothing billed"
    return (
        f"{data['period']}: {spend}; {savings_text(data)}. "
        f"Top jobs by spend: {top_jobs_text(data['top_jobs'])}"
    )


__all__ = [
    "TOP_JOBS",
    "message",
    "month_name",
    "months",
    "percent",
    "period_names",
    "previous_month",
    "savings_text",
    "summarize",
    "top_jobs_text",
    "usd",
]
