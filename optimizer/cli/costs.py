"""`gpuopt costs`: what the attempts cost, what they saved against on-demand, and what
overhead cost, grouped by job, policy, provider, market or month (docs/costs.md).

Through the daemon's API (`GET /costs`), like `gpuopt jobs`: the daemon prices live attempts
on its own clock and holds the database credentials; the command only shows its answer.
"""

from __future__ import annotations

import csv
import json
import sys
from typing import Annotated, Any

import typer

from optimizer.cli.client import ApiOption, call
from optimizer.cli.common import fail
from optimizer.costs.lines import GroupBy
from optimizer.costs.report import FIGURES, TimeError, add_up, parse_time, summary, utc_text

_BY = ", ".join(g.value for g in GroupBy)
_TIME = "a month (2026-03), a date (2026-03-14) or an ISO 8601 time, UTC unless it says"
CSV_COLUMNS: tuple[str, ...] = ("group", *FIGURES, "attempt_count", "baseline_known")


def costs(
    by: Annotated[str, typer.Option("--by", help=f"Group by one of: {_BY}.")] = "job",
    since: Annotated[
        str | None, typer.Option("--since", help=f"Months ending after this: {_TIME}.")
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help=f"Months starting before this (exclusive): {_TIME}."),
    ] = None,
    job: Annotated[str | None, typer.Option("--job", help="Only this job.")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Only this policy.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the API's JSON list.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print one CSV row per group.")] = False,
    api: ApiOption = None,
) -> None:
    """What attempts cost per group, against what on-demand would have: a table with a
    totals row and what spot saved, gross and net of overhead."""
    if by not in {g.value for g in GroupBy}:
        fail(f"--by: expected one of {_BY}, got {by!r}")
    params: dict[str, str] = {"by": by}
    try:
        if since is not None:
            params["since"] = utc_text(parse_time(since, "--since")) or ""
        if until is not None:
            params["until"] = utc_text(parse_time(until, "--until")) or ""
    except TimeError as exc:
        fail(exc)
    if as_json and as_csv:
        fail("--json and --csv: choose one")
    for name, value in (("job", job), ("policy", policy)):
        if value is not None:
            params[name] = value
    groups: list[dict[str, Any]] = call("GET", "/costs", api, params=params)
    if as_json:
        print(json.dumps(groups, indent=2))
        return
    if as_csv:
        writer = csv.DictWriter(sys.stdout, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(groups)
        return
    by_market = (
        groups
        if by == GroupBy.MARKET
        else call("GET", "/costs", api, params={**params, "by": GroupBy.MARKET.value})
    )
    from optimizer.cli.render import costs_table

    costs_table(groups, add_up(groups), by=by, note=summary(by_market))
