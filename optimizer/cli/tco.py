"""`gpuopt tco`: total cost of ownership of a GPU capacity over years, cloud against
on-premises (the model: optimizer/costs/tco.py; every formula: docs/tco.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from optimizer.cli.client import ApiOption
from optimizer.cli.common import fail

if TYPE_CHECKING:
    from optimizer.costs.tco import Comparison
    from optimizer.model import Offer


def tco(
    gpu: Annotated[
        str, typer.Option("--gpu", help="GPU model, canonical or alias (H100-80GB, a100-80gb).")
    ],
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs of capacity.")] = 8,
    hours_per_month: Annotated[
        float | None,
        typer.Option(
            "--hours-per-month",
            min=0,
            max=730,
            help="Hours a month the capacity is used (0-730). Without it: the most hours "
            "--budget buys, or with --from-history the ledger's average.",
        ),
    ] = None,
    years: Annotated[int, typer.Option("--years", min=1, max=10, help="Horizon in years.")] = 3,
    budget: Annotated[
        float | None,
        typer.Option("--budget", min=0, help="Monthly budget, USD: what fits, and for how long."),
    ] = None,
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            help="Choose the capacity under this policy file: its regions, compliance, buffer "
            "and bid caps (any market is compared).",
            dir_okay=False,
        ),
    ] = None,
    assumptions: Annotated[
        Path | None,
        typer.Option(
            "--assumptions", help="YAML file of TCO assumptions (docs/tco.md).", dir_okay=False
        ),
    ] = None,
    catalog: Annotated[
        Path | None,
        typer.Option(
            "--catalog", help="Read offers from this catalog CSV (default: the snapshot)."
        ),
    ] = None,
    provider: Annotated[
        list[str] | None,
        typer.Option("--provider", help="Ask this cloud live (aws, gcp, local); repeatable."),
    ] = None,
    from_history: Annotated[
        bool,
        typer.Option(
            "--from-history",
            help="Read the spot overhead (and, without --hours-per-month, the usage) from the "
            "daemon's cost ledger, for --policy's jobs when given.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    chart: Annotated[
        Path | None,
        typer.Option(
            "--chart",
            help="Write cumulative cost per option to this SVG or PNG file.",
            dir_okay=False,
        ),
    ] = None,
    api: ApiOption = None,
) -> None:
    """Compare on-demand, spot, 1- and 3-year commitments, a spot + commitment mix and
    on-premises servers for the same capacity and usage, over years."""
    from optimizer import hardware
    from optimizer.costs.tco import TcoError, Usage
    from optimizer.costs.tco_assumptions import (
        Assumptions,
        AssumptionsError,
        described,
        given_keys,
        load_assumptions,
    )
    from optimizer.costs.tco_plan import plan, plan_within_budget

    spec = hardware.lookup(gpu)
    if spec is None or not spec.known:
        known = ", ".join(g.name for g in hardware.all_gpus())
        fail(f"--gpu: unknown GPU model {gpu!r}; known models: {known}")
    if chart is not None and chart.suffix.lower() not in (".svg", ".png"):
        fail(f"--chart {chart}: write a .svg or .png file")
    try:
        values = load_assumptions(assumptions) if assumptions else Assumptions()
    except AssumptionsError as exc:
        fail(*exc.problems)
    given = given_keys(values)
    notes: list[str] = []
    offers, source, gap_notes = _offers(catalog, provider or [])
    policy_name = None
    if policy is not None:
        offers, policy_name = _under_policy(policy, offers)
    if catalog is None and not any(
        o.market.value == "committed" and o.gpu_model == spec.name for o in offers
    ):
        notes.append(
            f"no committed offer for {spec.name} from {source}"
            f"{' that the policy accepts' if policy_name else ''}: each commitment term is "
            "estimated from on-demand and the assumptions' discounts"
        )
        notes.extend(gap_notes)
    if from_history:
        from optimizer.cli.tco_history import read_history

        history = read_history(
            api,
            policy_name,
            capacity=f"{gpus}x {spec.name}",
            default_overhead=values.spot.overhead_fraction,
        )
        notes.extend(history.notes)
        if history.overhead_fraction is not None:
            values = values.model_copy(
                update={
                    "spot": values.spot.model_copy(
                        update={"overhead_fraction": history.overhead_fraction}
                    )
                }
            )
            given = given | {"spot.overhead_fraction"}
        if hours_per_month is None:
            hours_per_month = history.hours_per_month
    if hours_per_month is None and budget is None:
        fail(
            "--hours-per-month: give the usage, or --budget to compare at the most hours it "
            "buys, or --from-history with a ledger to read it from"
        )
    try:
        if hours_per_month is None:
            assert budget is not None
            usage = Usage(spec.name, gpus, 0.0, years)
            result = plan_within_budget(
                usage, offers, values, tdp_w=spec.tdp_w, budget_usd_per_month=budget
            )
        else:
            usage = Usage(spec.name, gpus, min(hours_per_month, 730.0), years)
            result = plan(usage, offers, values, tdp_w=spec.tdp_w, budget_usd_per_month=budget)
    except TcoError as exc:
        fail(str(exc))
    result.notes.extend(notes)
    if chart is not None:
        _write_chart(result, chart)
    if as_json:
        out = result.to_dict()
        out["source"] = source
        out["assumptions"] = described(values, given)
        if policy_name:
            out["policy"] = policy_name
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    _table(result, source, assumptions)


def _offers(catalog: Path | None, providers: list[str]) -> tuple[list[Offer], str, list[str]]:
    """(the offers, their source's name, what the snapshot said it lacks where it stood in)."""
    from optimizer.catalog import CatalogError
    from providers import registry
    from providers.snapshot import CatalogFileSource

    if catalog is not None:
        file_source = CatalogFileSource(catalog)
        try:
            return file_source.fetch_offers(), file_source.name, []
        except CatalogError as exc:
            fail(str(exc))
    names = [p.lower() for p in providers]
    for name in names:
        if registry.find(name) is None:
            fail(f"--provider: unknown provider {name!r}; known: {', '.join(registry.names())}")
    from optimizer.cli.sources import gather

    gathered = gather(names, (), commitments=True)
    lacking = [str(g) for g in gathered.lacking]
    for note in gathered.notes:
        if note not in lacking:  # those are the comparison's notes, printed once under it
            print(f"gpuopt: {note}", file=sys.stderr)
    return gathered.offers, ", ".join(gathered.names), lacking


def _under_policy(path: Path, offers: list[Offer]) -> tuple[list[Offer], str]:
    """The offers the policy accepts, every market allowed (the comparison is across them)
    and its monthly budget left to `--budget` (a budget is compared, not a filter here)."""
    from optimizer.cli import ranked
    from policies.schema import Budget

    arg = ranked.policy_arg(path)
    if arg.policy is None:
        fail(f"--policy {path}: no such file")
    wide = arg.policy.model_copy(
        update={"markets": ["on_demand", "spot", "committed"], "budget": Budget()}
    )
    ranking = ranked.evaluate_here(wide, offers)
    return [c.offer for c in ranking.candidates], arg.name


def _write_chart(result: Comparison, path: Path) -> None:
    from optimizer.cli.tco_chart import ChartUnavailable, write_chart

    try:
        write_chart(result, path)
    except ChartUnavailable as exc:
        fail(f"--chart: {exc}")
    except OSError as exc:
        fail(f"--chart {path}: {exc.strerror or exc}")


def _usd(value: float) -> str:
    return f"${value:,.0f}"


def _table(result: Comparison, source: str, assumptions: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    u = result.usage
    table = Table(
        title=f"{u.gpus}x {u.gpu_model}, {u.hours_per_month:g} h/month, {u.years} year(s) "
        f"(prices: {source}; assumptions: {assumptions or 'defaults, docs/tco.md'})"
    )
    for header in ("option", "where", "total", "per month", "$/GPU-h used", "fixed", "notes"):
        numeric = header in ("total", "per month", "$/GPU-h used", "fixed")
        table.add_column(header, justify="right" if numeric else "left")
    h = u.hours_per_month
    for option in sorted(result.options, key=lambda o: o.total(h)):
        data: dict[str, Any] = option.to_dict(u)
        mark = " *" if option is result.cheapest else ""
        per_gpu = data["usd_per_gpu_hour"]
        table.add_row(
            option.name + mark,
            option.where,
            _usd(data["total_usd"]),
            _usd(data["monthly_usd"]),
            "-" if per_gpu is None else f"${per_gpu:,.2f}",
            _usd(option.fixed_usd),
            "; ".join(option.notes),
        )
    console.print(table)
    console.print(f"* the cheapest option at {h:g} h/month")
    crossings = [b for b in result.break_evens if b.hours_per_month is not None]
    if crossings:
        console.print("Break-even usage:")
        for b in crossings:
            console.print(
                f"  {b.a} = {b.b} at {b.hours_per_month:,.0f} h/month "
                f"({b.below} cheaper below, {b.above} above)"
            )
    for note in result.notes:
        console.print(f"note: {note}")
    console.print(result.recommendation)
