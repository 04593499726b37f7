"""`gpuopt backtest` and `gpuopt advise-bid`: a policy replayed over a price history
(docs/backtest.md). They read a history file or the store directly; no daemon is needed.
`gpuopt backtest --traces DIR` replays a deadline strategy over spot traces instead
(docs/deadlines.md)."""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
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
    policy_file: Annotated[
        Path | None,
        typer.Argument(help="The policy YAML (not with --traces).", dir_okay=False),
    ] = None,
    history: HistoryOption = None,
    from_store: FromStoreOption = False,
    config: ConfigOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    traces: Annotated[
        Path | None,
        typer.Option("--traces", help="Spot traces (a folder or a file): replay a deadline."),
    ] = None,
    work: Annotated[str, typer.Option("--work", help="Work to do, e.g. 48h.")] = "48h",
    deadline: Annotated[
        str, typer.Option("--deadline", help="Deadline after the start, e.g. 52h.")
    ] = "52h",
    restart_overhead: Annotated[
        str, typer.Option("--restart-overhead", help="What one restart costs, e.g. 0.2h.")
    ] = "0.2h",
    spot_price: Annotated[
        float | None, typer.Option("--spot-price", help="USD/h per node on spot.")
    ] = None,
    on_demand_price: Annotated[
        float | None, typer.Option("--on-demand-price", help="USD/h per node on-demand.")
    ] = None,
    price_file: Annotated[
        Path | None,
        typer.Option("--price-file", help="JSON or CSV giving spot and on_demand USD/h."),
    ] = None,
    starts: Annotated[
        int | None, typer.Option("--starts", help="Start offsets spread over the trace.")
    ] = None,
    start_at: Annotated[
        str | None, typer.Option("--start", help="One start offset into the trace, e.g. 12h.")
    ] = None,
    multi_zone: Annotated[
        bool, typer.Option("--multi-zone", help="All traces as zones of one replay.")
    ] = False,
    strategy_name: Annotated[
        str, typer.Option("--strategy", help="gpuopt, greedy or uniform-progress.")
    ] = "gpuopt",
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes of the job.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Replay a policy over a price history: cost, on-demand baseline, moves, gaps. With
    --traces: a deadline strategy over spot traces, with the offline optimum and greedy."""
    if traces is not None:
        if policy_file is not None or history is not None or from_store:
            fail("--traces replays a deadline strategy: give no policy, --history or --from-store")
        _deadline_backtest(
            _DeadlineArgs(
                traces=traces,
                work=work,
                deadline=deadline,
                restart_overhead=restart_overhead,
                spot_price=spot_price,
                on_demand_price=on_demand_price,
                price_file=price_file,
                starts=starts,
                start=start_at,
                multi_zone=multi_zone,
                strategy=strategy_name,
                nodes=nodes,
                as_json=as_json,
            )
        )
        return
    if policy_file is None:
        fail("give the policy YAML (or --traces DIR to replay a deadline)")
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
    """The lowest bid cap that kept a candidate in the target share of snapshots, each cap
    replayed as `gpuopt backtest` replays the policy (its migration block included)."""
    from optimizer.jobs.backtest import Migrations
    from policies.backtest import BacktestError, advise_bid

    start, end = parse_time(since, "--since"), parse_time(until, "--until")
    policy, points = _inputs(policy_file, history, from_store, config, start, end)
    mover = (lambda: Migrations(policy, points)) if policy.migration.enabled else None
    try:
        advice = advise_bid(policy, points, target_availability, start, end, mover=mover)
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
            why = out["why_none"].get(name, "")
            print(f"  {name:<27} no value reaches the target" + (f": {why}" if why else ""))
            continue
        cap = ", ".join(f"{k}={v:g}" for k, v in row["bid"].items()) or "as written"
        cost = "n/a" if row["cost_usd"] is None else f"${row['cost_usd']:,.2f}"
        print(f"  {name:<27} {cap:<34} available {row['availability']:.1%}  cost {cost}")
    for warning in out["warnings"]:
        print(f"  warning: {warning}")


# --- `backtest --traces`: a deadline strategy replayed over spot traces (docs/deadlines.md)

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class _DeadlineArgs:
    traces: Path
    work: str
    deadline: str
    restart_overhead: str
    spot_price: float | None
    on_demand_price: float | None
    price_file: Path | None
    starts: int | None
    start: str | None
    multi_zone: bool
    strategy: str
    nodes: int
    as_json: bool


def parse_duration(value: str, option: str) -> float:
    """Seconds from `48h`, `30m`, `0.2h`, `90s` or `2d`."""
    text = value.strip().lower()
    unit = _UNITS.get(text[-1:])
    try:
        number = float(text[:-1]) if unit else None
    except ValueError:
        number = None
    if unit is None or number is None or not math.isfinite(number) or number < 0:
        fail(f"{option}: {value!r} is not a duration (e.g. 48h, 30m or 0.2h)")
    return number * unit


def _price(raw: Any, where: str) -> float:
    try:
        price = float(raw)
    except (TypeError, ValueError):
        fail(f"{where}: expected a price in USD per hour, got {raw!r}")
    if not math.isfinite(price) or price < 0:
        fail(f"{where}: expected a price >= 0 in USD per hour, got {raw!r}")
    return price


def read_price_file(path: Path) -> tuple[float, float]:
    """(spot, on-demand) USD/h per node from a JSON object `{"spot": .., "on_demand": ..}`
    or a CSV with the header `market,usd_per_hour` and the rows `spot` and `on_demand`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")
    found: dict[str, float] = {}
    if path.suffix.lower() == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            fail(f"{path}:{exc.lineno}: not JSON: {exc.msg}")
        if not isinstance(raw, dict):
            fail(f"{path}: expected an object with `spot` and `on_demand`")
        for key in ("spot", "on_demand"):
            if key in raw:
                found[key] = _price(raw[key], f"{path}: {key}")
    else:
        rows = list(csv.reader(text.splitlines()))
        if not rows or [c.strip() for c in rows[0]] != ["market", "usd_per_hour"]:
            fail(f"{path}:1: expected the header `market,usd_per_hour`")
        for line, row in enumerate(rows[1:], start=2):
            if not row:
                continue
            if len(row) != 2 or row[0].strip() not in ("spot", "on_demand"):
                fail(f"{path}:{line}: expected `spot,PRICE` or `on_demand,PRICE`")
            found[row[0].strip()] = _price(row[1].strip(), f"{path}:{line}: usd_per_hour")
    for key in ("spot", "on_demand"):
        if key not in found:
            fail(f"{path}: {key}: missing")
    return found["spot"], found["on_demand"]


def _prices(args: _DeadlineArgs) -> tuple[float, float]:
    from policies.deadline.model import DEFAULT_SPOT_RATIO

    if args.price_file is not None:
        if args.spot_price is not None or args.on_demand_price is not None:
            fail("give --price-file or --spot-price/--on-demand-price, not both")
        return read_price_file(args.price_file)
    if args.on_demand_price is None:
        fail("give --on-demand-price (and --spot-price) or --price-file")
    on_demand = _price(args.on_demand_price, "--on-demand-price")
    if args.spot_price is None:
        return on_demand * DEFAULT_SPOT_RATIO, on_demand
    return _price(args.spot_price, "--spot-price"), on_demand


def _deadline_backtest(args: _DeadlineArgs) -> None:
    from policies.deadline import STRATEGIES, TraceError, optimum, read_traces, replay, strategy
    from policies.deadline.timeline import timeline

    work = parse_duration(args.work, "--work")
    deadline = parse_duration(args.deadline, "--deadline")
    overhead = parse_duration(args.restart_overhead, "--restart-overhead")
    if work <= 0:
        fail("--work: expected more than 0")
    if deadline <= 0:
        fail("--deadline: expected more than 0")
    if args.strategy not in STRATEGIES:
        fail(f"--strategy: unknown {args.strategy!r} (known: {', '.join(sorted(STRATEGIES))})")
    if args.nodes < 1:
        fail(f"--nodes: expected 1 or more, got {args.nodes}")
    if args.starts is not None and args.start is not None:
        fail("give --starts N or --start T, not both")
    if args.starts is not None and args.starts < 1:
        fail(f"--starts: expected 1 or more, got {args.starts}")
    offset = parse_duration(args.start, "--start") if args.start is not None else 0.0
    spot_price, on_demand_price = _prices(args)
    try:
        loaded = read_traces(args.traces)
        groups = [loaded] if args.multi_zone else [[t] for t in loaded]
        lines = [timeline(g, args.nodes) for g in groups]
    except TraceError as exc:
        fail(exc)
    rows: list[dict[str, Any]] = []
    for group, line in zip(groups, lines, strict=True):
        name = group[0].name if len(group) == 1 else f"{len(group)} zones"
        last = max(0, line.ticks - math.ceil(deadline / line.gap_s))
        if args.starts is not None:
            ticks = sorted({j * last // args.starts for j in range(args.starts)})
        else:
            ticks = [int(offset // line.gap_s)]
            if ticks[0] >= line.ticks:
                fail(f"--start: {args.start} is past the end of {name}")
        for tick in ticks:
            job: dict[str, Any] = dict(
                start_tick=tick,
                work_s=work,
                deadline_s=deadline,
                overhead_s=overhead,
                spot_price=spot_price,
                on_demand_price=on_demand_price,
                nodes=args.nodes,
            )
            out = replay(strategy(args.strategy), group, **job)
            greedy = replay(strategy("greedy"), group, **job)
            best = optimum(group, **job)
            rows.append(
                {
                    "trace": name,
                    "zones": [t.zone for t in group],
                    "start_hours": tick * line.gap_s / 3600,
                    "strategy": args.strategy,
                    "cost_usd": round(out.cost_usd, 4),
                    "on_demand_cost_usd": round(out.on_demand_cost_usd, 4),
                    "cost_ratio": round(out.cost_usd / out.on_demand_cost_usd, 4),
                    "deadline_met": out.deadline_met,
                    "restarts": out.restarts,
                    "spot_hours": round(out.spot_hours, 4),
                    "on_demand_hours": round(out.on_demand_hours, 4),
                    "finish_hours": None if out.finish_s is None else out.finish_s / 3600,
                    "optimum_cost_usd": None if best is None else round(best, 4),
                    "greedy_cost_usd": round(greedy.cost_usd, 4),
                    "greedy_deadline_met": greedy.deadline_met,
                }
            )
    if args.as_json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    _print_table(rows, args, work, deadline, overhead, spot_price, on_demand_price)


def _print_table(
    rows: list[dict[str, Any]],
    args: _DeadlineArgs,
    work: float,
    deadline: float,
    overhead: float,
    spot_price: float,
    on_demand_price: float,
) -> None:
    print(
        f"strategy {args.strategy}: work {work / 3600:g} h, deadline {deadline / 3600:g} h, "
        f"restart {overhead / 3600:g} h, spot ${spot_price:g}/h, on-demand "
        f"${on_demand_price:g}/h, {args.nodes} node(s)"
    )
    head = ("trace", "start h", "cost $", "/ OD", "met", "restarts", "spot h", "OD h")
    print(
        f"{head[0]:<28} {head[1]:>8} {head[2]:>9} {head[3]:>6} {head[4]:>4} {head[5]:>8} "
        f"{head[6]:>7} {head[7]:>7} {'optimum $':>10} {'greedy $':>9}"
    )
    for r in rows:
        best = "n/a" if r["optimum_cost_usd"] is None else f"{r['optimum_cost_usd']:,.2f}"
        print(
            f"{r['trace']:<28} {r['start_hours']:>8.1f} {r['cost_usd']:>9,.2f} "
            f"{r['cost_ratio']:>6.3f} {'yes' if r['deadline_met'] else 'NO':>4} "
            f"{r['restarts']:>8} {r['spot_hours']:>7.1f} {r['on_demand_hours']:>7.1f} "
            f"{best:>10} {r['greedy_cost_usd']:>9,.2f}"
        )
    misses = sum(not r["deadline_met"] for r in rows)
    mean = sum(r["cost_ratio"] for r in rows) / len(rows)
    print(f"{len(rows)} replays: mean cost / on-demand {mean:.3f}, deadlines missed {misses}")
