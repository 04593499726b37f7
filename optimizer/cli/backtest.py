"""`gpuopt backtest` and `gpuopt advise-bid`: a policy replayed over a price history
(docs/backtest.md). They read a history file or the store directly; no daemon is needed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from optimizer.cli.common import fail
from optimizer.cli.prices import parse_time

HistoryOption = Annotated[
    Path | None,
    typer.Option("--history", help="A catalog CSV with many observed_at per pool.", dir_okay=False),
]
FromStoreOption = Annotated[
    bool, typer.Option("--from-store", help="The store's price history (the daemon's config).")
]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="Daemon config, for --from-store.")
]
SinceOption = Annotated[str | None, typer.Option("--since", help="ISO 8601 time: start here.")]
UntilOption = Annotated[str | None, typer.Option("--until", help="ISO 8601 time: run until.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def _inputs(
    policy_file: Path,
    history: Path | None,
    from_store: bool,
    config: Path | None,
    since: Any,
    until: Any,
) -> tuple[Any, Any]:
    from optimizer.catalog import CatalogError
    from optimizer.jobs.history import read_history, store_history
    from policies.loader import PolicyError, load_policy

    if (history is None) == (not from_store):
        fail("give one of --history FILE or --from-store")
    try:
        policy = load_policy(policy_file)
    except PolicyError as exc:
        fail(exc)
    if history is not None:
        try:
            return policy, read_history(history)
        except CatalogError as exc:
            fail(exc)
    from optimizer.cli.db import configured_database_url
    from optimizer.store import Store

    with Store(configured_database_url(config)) as store:
        return policy, store_history(store, since, until)


def backtest(
    policy_file: Annotated[Path, typer.Argument(help="The policy YAML.", dir_okay=False)],
    history: HistoryOption = None,
    from_store: FromStoreOption = False,
    config: ConfigOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replay a policy over a price history: cost, on-demand baseline, moves, gaps."""
    from optimizer.jobs.backtest import Migrations
    from policies.backtest import BacktestError, replay

    start, end = parse_time(since, "--since"), parse_time(until, "--until")
    policy, points = _inputs(policy_file, history, from_store, config, start, end)
    mover = Migrations(policy, points) if policy.migration.enabled else None
    try:
        result = replay(policy, points, start, end, mover=mover)
    except BacktestError as exc:
        fail(exc)
    if as_json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    out = result.to_dict(series=False)
    print(f"policy {out['policy']}: {out['start']} to {out['end']}, {out['hours']:.1f} h")
    print(f"  snapshots {out['snapshots']}, pools {out['pools']}")
    print(f"  cost       ${out['cost_usd']:,.2f}")
    print(f"  on-demand  ${out['on_demand_usd']:,.2f} (same shape)")
    print(f"  savings    ${out['savings_usd']:,.2f}")
    print(f"  moves {out['moves']} ({out['migrations']} by migration), "
          f"cap crossings {out['cap_crossings']}")  # fmt: skip
    print(f"  hours without a candidate {out['hours_without_candidate']:.2f}")
    if out["hours_without_baseline"]:
        print(f"  hours without an on-demand price {out['hours_without_baseline']:.2f}")


def advise_bid(
    policy_file: Annotated[Path, typer.Argument(help="The policy YAML.", dir_okay=False)],
    target_availability: Annotated[
        float, typer.Option("--target-availability", help="Share of snapshots, 0..1.")
    ] = 0.95,
    history: HistoryOption = None,
    from_store: FromStoreOption = False,
    config: ConfigOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    as_json: JsonOption = False,
) -> None:
    """The lowest bid cap that kept a candidate in the target share of snapshots."""
    from policies.backtest import BacktestError, advise_bid

    start, end = parse_time(since, "--since"), parse_time(until, "--until")
    policy, points = _inputs(policy_file, history, from_store, config, start, end)
    try:
        advice = advise_bid(policy, points, target_availability, start, end)
    except BacktestError as exc:
        fail(exc)
    out = advice.to_dict()
    if as_json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(f"policy {out['policy']}: target {out['target_availability']:.0%} of "
          f"{out['snapshots']} snapshots")  # fmt: skip
    rows = [("current caps", out["current"])]
    rows.append(("max_usd_per_hour", out["max_usd_per_hour"]))
    rows.append(("max_fraction_of_on_demand", out["max_fraction_of_on_demand"]))
    for name, row in rows:
        if row is None:
            print(f"  {name:<27} no value reaches the target")
            continue
        cap = ", ".join(f"{k}={v:g}" for k, v in row["bid"].items()) or "as written"
        cost = "n/a" if row["cost_usd"] is None else f"${row['cost_usd']:,.2f}"
        print(f"  {name:<27} {cap:<34} available {row['availability']:.1%}  cost {cost}")
