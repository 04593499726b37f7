"""`gpuopt jobs list` and `gpuopt jobs show`: the queue as a table, and one job in full (its
attempts with placement, times, end reason and cost, its policy, its latest events), laid
out by optimizer/cli/render.py so that both fit a terminal."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optimizer.cli.render import Column, say, table
from optimizer.common.units import duration_text

if TYPE_CHECKING:
    from optimizer.answers import AttemptView, EventView, JobDetail, JobView, PlacementView

LIST_COLUMNS = [
    Column("NAME", key=True),
    Column("STATE", key=True),
    Column("PLACEMENT", key=True),
    Column("MARKET", drop=2),
    Column("$/h", right=True, key=True),
    Column("AGE", right=True, drop=3),
    Column("RAN", right=True, drop=2),
    Column("RESTARTS", right=True, drop=3),
    Column("SPEND $", right=True, key=True),
    Column("PROGRESS", cut=True, drop=4),
    Column("REASON", cut=True, drop=5),
]


def usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def price(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else duration_text(seconds)


def placement_text(p: PlacementView | None) -> str:
    """`local us-local-1a g5.xlarge` (`x2` for two nodes; `(starting)` before the job runs
    there); `-` on no instance."""
    if p is None:
        return "-"
    text = f"{p.provider} {p.zone or p.region} {p.instance_type}"
    if p.nodes > 1:
        text += f" x{p.nodes}"
    return text if p.running else text + " (starting)"


def list_rows(jobs: Sequence[JobView], progress: Any) -> list[list[str]]:
    """The queue's rows; `progress` makes the progress cell (optimizer/cli/jobs.py)."""
    rows = []
    for job in jobs:
        p = job.placement
        rows.append(
            [
                job.name,
                job.state,
                placement_text(p),
                "-" if p is None else p.market,
                "-" if p is None else price(p.usd_per_hour),
                duration(job.age_s),
                duration(job.running_s),
                str(job.restarts),
                usd(job.spend_usd),
                progress(job.progress),
                job.reason or "-",
            ]
        )
    return rows


def print_list(jobs: Sequence[JobView], progress: Any, *, everything: bool, wide: bool) -> None:
    if not jobs:
        print("no jobs" if everything else "no live jobs (--all shows ended ones)")
        return
    table(LIST_COLUMNS, list_rows(jobs, progress), wide=wide)


ATTEMPT_COLUMNS = [
    Column("#", right=True, key=True),
    Column("PLACEMENT", key=True),
    Column("MARKET", drop=2),
    Column("$/h", right=True, key=True),
    Column("STARTED (UTC)", drop=2),
    Column("ENDED (UTC)", drop=3),
    Column("RAN", right=True, drop=4),
    Column("STATUS", cut=True, drop=0),
    Column("SPEND $", right=True, key=True),
]


def _hhmm(text: str | None) -> str:
    """`12-02 01:10` for the API's `2026-12-02T01:10:27Z`."""
    return f"{text[5:10]} {text[11:16]}" if text else "-"


def _ran(a: AttemptView) -> str:
    from optimizer.clock import parse_utc

    if not a.started_at or not a.ended_at:
        return "-"
    return duration_text((parse_utc(a.ended_at) - parse_utc(a.started_at)).total_seconds())


def attempt_rows(attempts: Sequence[AttemptView]) -> list[list[str]]:
    rows = []
    for a in attempts:
        number = str(a.number) if a.nodes <= 1 else f"{a.gang or a.number}/n{a.node_rank}"
        where = f"{a.provider} {a.zone or a.region} {a.instance_type}"
        end = a.state if a.end_reason is None else a.end_reason  # live: its state
        if a.terminated_by:
            end += f" (by {a.terminated_by})"  # who ended its instance: cloud, gpuopt
        cost = sum(float(line.spend_usd) for line in a.cost_lines)
        rows.append(
            [
                number,
                where,
                a.market,
                price(a.usd_per_hour),
                _hhmm(a.launched_at or a.started_at),
                _hhmm(a.ended_at),
                _ran(a),
                end,
                usd(cost) if a.cost_lines else "-",
            ]
        )
    return rows


EVENT_COLUMNS = [
    Column("AT (UTC)", key=True),
    Column("SEVERITY", drop=1),
    Column("KIND", key=True),
    Column("MESSAGE", cut=True, drop=0),
]


def event_rows(events: Sequence[EventView]) -> list[list[str]]:
    return [[_hhmm(e.at), e.severity, e.kind, e.message] for e in events]


def policy_lines(job: JobDetail) -> list[str]:
    """The job's policy: its name, or where the API gives the effective policy (the policy
    with the job's inline resources merged over it) its header and summary lines, as the
    plan prints them (optimizer/cli/plan.py)."""
    from optimizer.cli.plan import effective_policy_header, effective_policy_lines

    effective = getattr(job, "effective_policy", None) or (job.model_extra or {}).get(
        "effective_policy"
    )
    if not isinstance(effective, dict) or not effective:
        return [f"policy: {job.policy}"]
    header = effective_policy_header(job.model_copy(update={"effective_policy": effective}))
    return [header, *("  " + line for line in effective_policy_lines(effective))]


def _in(wide: bool) -> dict[str, Any]:
    return {"wide": wide, "indent": "  ", "hang": True}


def print_show(job: JobDetail, events: Sequence[EventView], *, head: Any, wide: bool) -> None:
    """One job: `head` prints its summary lines (state, reason, progress, GPU, deadline:
    optimizer/cli/jobs.py), then its placement, time and spend, its policy, its attempts
    and its latest events."""
    told = io.StringIO()
    with contextlib.redirect_stdout(told):
        head(job)
    for line in told.getvalue().splitlines():
        text = line.lstrip(" ")
        say(text, wide=wide, indent=line[: len(line) - len(text)], hang=True)
    p = job.placement
    if p is not None:
        say(f"now on: {placement_text(p)}, {p.market} at ${price(p.usd_per_hour)}/h", **_in(wide))
    if job.age_s is not None:  # a daemon from before the queue's fields gives none
        say(
            f"age {duration(job.age_s)}, ran {duration(job.running_s)}, "
            f"spend so far ${usd(job.spend_usd)}",
            **_in(wide),
        )
    for line in policy_lines(job):
        say(line.lstrip(" "), indent="  " + line[: len(line) - len(line.lstrip(" "))], wide=wide)
    print()
    if job.attempts:
        table(ATTEMPT_COLUMNS, attempt_rows(job.attempts), title="Attempts", wide=wide)
    else:
        print("Attempts: none yet")
    print()
    if events:
        title = f"Latest {len(events)} events (gpuopt jobs events {job.name} shows all)"
        table(EVENT_COLUMNS, event_rows(events), title=title, wide=wide)
    else:
        print("Events: none")
