"""`gpuopt prices history`: one pool's price points in effect, through the daemon's API."""

from __future__ import annotations

import csv
import json
import sys
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from optimizer.cli.client import ApiOption, call, read
from optimizer.cli.common import fail
from optimizer.clock import parse_utc, utc_text
from optimizer.common.times import TimeRangeError, in_span

if TYPE_CHECKING:
    from optimizer.answers import PricePointView

app = typer.Typer(help="Price history (through the daemon's API).", no_args_is_help=True)

COLUMNS = ("at", "tier", "usd_per_hour", "min_usd", "max_usd", "points")
PAGE = 10_000  # the API's largest page


class MarketChoice(StrEnum):
    spot = "spot"
    on_demand = "on_demand"
    on_demand_dash = "on-demand"


def parse_time(value: str | None, option: str) -> datetime | None:
    """An ISO 8601 time (a date alone is its midnight), 1970 to 2200; without an offset it is
    UTC."""
    if value is None:
        return None
    try:
        parsed = parse_utc(value.strip())
    except ValueError:
        fail(f"{option}: {value!r} is not an ISO 8601 time (e.g. 2026-03-01 or 2026-03-01T12:00Z)")
    try:
        return in_span(parsed, option)
    except TimeRangeError as exc:
        fail(exc)


def iso(value: datetime) -> str:
    return utc_text(value)


@app.command("history")
def history(
    provider: Annotated[str, typer.Option("--provider", help="The pool's provider.")],
    region: Annotated[str, typer.Option("--region", help="The pool's region.")],
    instance_type: Annotated[str, typer.Option("--instance-type", help="The instance type.")],
    zone: Annotated[
        str | None,
        typer.Option("--zone", help="The pool's zone (leave out for a pool priced per region)."),
    ] = None,
    market: Annotated[MarketChoice, typer.Option("--market", help="spot or on_demand.")] = (
        MarketChoice.spot
    ),
    since: Annotated[
        str | None,
        typer.Option("--since", help="ISO 8601 time (UTC unless it says); the price then first."),
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="ISO 8601 time (UTC unless it says), exclusive.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of points.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV with a header row.")] = False,
    api: ApiOption = None,
) -> None:
    """The price points in effect for one pool, oldest first: raw observations where they are
    kept, hourly medians (with min, max and count) past the raw retention. With --since, the
    first point is the price in effect at that time."""
    from providers import registry

    if as_json and as_csv:
        fail("--json and --csv: choose one")
    if registry.find(provider) is None:
        fail(f"--provider: unknown provider {provider!r}; known: {', '.join(registry.names())}")
    start, end = parse_time(since, "--since"), parse_time(until, "--until")
    if start is not None and end is not None and end <= start:
        fail("--until: must be later than --since")
    query: dict[str, Any] = {
        "provider": provider,
        "region": region,
        "instance_type": instance_type,
        "market": market.value.replace("-", "_"),
        "limit": PAGE,
    }
    if zone:
        query["zone"] = zone
    if end is not None:
        query["until"] = iso(end)
    points, read_points = _all_pages(query, start, api)

    if as_json:
        json.dump(points, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({name: p[name] for name in COLUMNS} for p in points)
    else:
        pool = " ".join([provider, region, zone or "(regional)", instance_type, query["market"]])
        _table(read_points, pool, zone_given=bool(zone))


def _all_pages(
    query: dict[str, Any], start: datetime | None, api: str | None
) -> tuple[list[Any], list[PricePointView]]:
    """Every page's points: as the daemon sent them (for --json and --csv) and as read."""
    from optimizer.answers import PriceHistory

    points: list[Any] = []
    read_points: list[PricePointView] = []
    since, prior = start, True
    while True:
        page = dict(query, prior=str(prior).lower())
        if since is not None:
            page["since"] = iso(since)
        answer = call("GET", "/prices/history", api, params=page)
        history = read(PriceHistory, answer)
        points.extend(answer["points"])
        read_points.extend(history.points)
        if not history.next_since:
            return points, read_points
        since, prior = parse_time(history.next_since, "next_since"), False


def _table(points: list[PricePointView], pool: str, *, zone_given: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped: never truncate a time or a price
    if not points:
        hint = "" if zone_given else " (a pool priced per zone needs --zone)"
        console.print(f"No price points for {pool}{hint}.")
        return
    console.print(f"{pool}: {len(points)} points in effect, oldest first (times UTC)")
    table = Table()
    for header in ("from", "tier", "$/h", "min $/h", "max $/h", "points"):
        table.add_column(header, justify="left" if header in ("from", "tier") else "right")
    for p in points:
        table.add_row(
            p.at,
            p.tier,
            f"{p.usd_per_hour:.4f}",
            f"{p.min_usd:.4f}",
            f"{p.max_usd:.4f}",
            str(p.points),
        )
    console.print(table)


@app.command("export")
def export(
    since: Annotated[str, typer.Option("--since", help="ISO 8601 time: points from here on.")],
    output: Annotated[
        str, typer.Option("-o", "--output", help="The file to write: .csv, .arrow or .parquet.")
    ],
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="Daemon config (its store).")
    ] = None,
) -> None:
    """Write the store's price history since --since for backtests: raw points, and each
    hourly summary as its median at the start of its hour; a catalog CSV, or Arrow IPC
    (.arrow) or Parquet (.parquet) with the same columns."""
    from pathlib import Path

    from optimizer.cli.db import configured_database_url
    from optimizer.jobs.history import columns_history, write_history
    from optimizer.store import Store

    start = parse_time(since, "--since")
    with Store(configured_database_url(Path(config) if config else None)) as store:
        found = store.prices.history_columns(start)
    points = columns_history(found)
    count = write_history(points, output, comment=f"gpuopt prices export --since {since}")
    hourly = f" ({found.hourly} of them hourly medians)" if found.hourly else ""
    print(f"wrote {count} price points{hourly} of {len(points.pools)} pools to {output}")
