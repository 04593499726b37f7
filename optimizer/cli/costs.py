"""`gpuopt costs`: what the attempts cost, what they saved against on-demand, and what
overhead cost, grouped by job, policy, provider, market or month (docs/costs.md).

Through the daemon's API (`GET /costs`), like `gpuopt jobs`: the daemon prices live attempts
on its own clock and holds the database credentials; the command only shows its answer.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from optimizer.cli.client import ApiOption, NoDaemon, call, check, request
from optimizer.cli.common import fail
from optimizer.cli.render import WideOption
from optimizer.costs.lines import GroupBy
from optimizer.costs.report import FIGURES, TimeError, add_up, parse_time, summary, utc_text

_BY = ", ".join(g.value for g in GroupBy)
_TIME = "a month (2026-03), a date (2026-03-14) or an ISO 8601 time, UTC unless it says"
CSV_COLUMNS: tuple[str, ...] = ("group", *FIGURES, "attempt_count", "baseline_known")


def _focus(params: dict[str, str], path: Path | None, api: str | None) -> None:
    """The selected lines as FOCUS CSV (`GET /costs?format=focus`), to `path` or stdout."""
    try:
        response = request("GET", "/costs", api, params={**params, "format": "focus"})
    except NoDaemon as exc:
        fail(str(exc))
    if response.status_code >= 400:
        check(response)
    if path is None:
        sys.stdout.write(response.text)
        return
    try:
        path.write_text(response.text, encoding="utf-8")
    except OSError as exc:
        fail(f"--output: cannot write {path}: {exc.strerror or exc}")
    rows = max(response.text.count("\n") - 1, 0)
    print(f"wrote {rows} FOCUS row(s) to {path}")


def _notify(params: dict[str, str], api: str | None) -> None:
    """Ask the daemon to raise the cost summary alert now (`POST /costs/notify`)."""
    answer: dict[str, Any] = call("POST", "/costs/notify", api, params=params)
    channels = answer.get("channels") or []
    where = (
        f"sent to {', '.join(channels)}"
        if channels
        else "no alert channel routes costs.monthly_summary: recorded as an event only"
    )
    print(f"cost summary raised (event {answer.get('event_id')}), {where}:")
    print(answer.get("message", ""))


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
    focus: Annotated[
        bool,
        typer.Option("--focus", help="Print the selected lines as a FinOps FOCUS 1.1 CSV."),
    ] = False,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="wide: every column, nothing cut; json: as --json; with --focus: write the "
            "CSV to this file instead of stdout.",
            show_default=False,
        ),
    ] = None,
    wide: WideOption = False,
    notify: Annotated[
        bool,
        typer.Option(
            "--notify",
            help="Raise the cost summary alert now: last month's, or the months --since and "
            "--until select.",
        ),
    ] = False,
    api: ApiOption = None,
) -> None:
    """What attempts cost per group, against what on-demand would have: a table with a
    totals row and what spot saved, gross and net of overhead. --focus exports the lines as
    a FOCUS CSV; --notify sends the monthly summary alert now."""
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
    given = {"--json": as_json, "--csv": as_csv, "--focus": focus, "--notify": notify}
    chosen = [name for name, on in given.items() if on]
    if len(chosen) > 1:
        fail(f"{' and '.join(chosen)}: choose one")
    if output is not None and not focus and output not in ("wide", "json"):
        fail(f"--output {output}: expected wide or json (a file only with --focus)")
    as_json = as_json or (output == "json" and not focus)
    wide = wide or (output == "wide" and not focus)
    if notify:
        if job is not None or policy is not None or by != "job":
            fail("--notify: summarizes every job; only --since and --until apply")
        _notify({k: v for k, v in params.items() if k != "by"}, api)
        return
    for name, value in (("job", job), ("policy", policy)):
        if value is not None:
            params[name] = value
    if focus:
        _focus(params, None if output is None else Path(output), api)
        return
    groups: list[dict[str, Any]] = call("GET", "/costs", api, params=params)
    if as_json:
        print(json.dumps(groups, indent=2))
        return
    if as_csv:
        writer = csv.DictWriter(sys.stdout, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(groups)
        return
    from optimizer.cli.tables import costs_table

    costs_table(groups, add_up(groups), by=by, note=summary(groups), wide=wide)
