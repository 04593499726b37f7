"""`gpuopt offers`: list GPU offers, cheapest first, optionally ranked under a policy (by the
daemon when one answers: optimizer/cli/ranked.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from optimizer.cli.client import ApiOption
from optimizer.cli.common import fail
from optimizer.cli.render import OutputOption, WideOption, wants_wide

if TYPE_CHECKING:
    from datetime import datetime

    from optimizer.model import Offer
    from optimizer.offers import OfferQuery
    from policies.schema import Policy


class MarketChoice(StrEnum):
    spot = "spot"
    on_demand = "on_demand"
    on_demand_dash = "on-demand"
    committed = "committed"


def offers(
    gpu: Annotated[
        list[str] | None,
        typer.Option("--gpu", help="GPU model, canonical or alias (A100-80GB, h100); repeatable."),
    ] = None,
    min_gpu_memory: Annotated[
        float | None,
        typer.Option("--min-gpu-memory", min=0, help="Minimum memory per GPU, GiB."),
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=1, help="Minimum GPUs per instance.")
    ] = None,
    region: Annotated[
        list[str] | None,
        typer.Option("--region", help="Region glob (eu-*, europe-west4); repeatable."),
    ] = None,
    provider: Annotated[
        list[str] | None,
        typer.Option(
            "--provider",
            help="local: the local cloud's simulated prices; aws or gcp: query that cloud live "
            "(credentials needed; else its snapshot rows). Repeatable.",
        ),
    ] = None,
    market: Annotated[MarketChoice | None, typer.Option("--market", help="Only this market.")] = (
        None
    ),
    max_price: Annotated[
        float | None, typer.Option("--max-price", min=0, help="Maximum USD per instance-hour.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=0, help="Show at most this many rows (0 = all).")
    ] = 20,
    catalog: Annotated[
        Path | None,
        typer.Option("--catalog", help="Read offers from this catalog CSV instead.", dir_okay=True),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of offers.")] = False,
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            help="Rank under this policy file (or a policy the daemon has loaded, by name): "
            "the daemon ranks its live offers as its next launch would; with no daemon, the "
            "file is ranked here.",
            dir_okay=True,
        ),
    ] = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="With --policy: show why offers were rejected.")
    ] = False,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="With --policy: rank under the policy in force at this instant, ISO 8601 "
            "with a UTC offset (2026-12-01T10:00:00+01:00): its schedule window then.",
        ),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            help="Rank as this job's next launch (its policy, and what moving its checkpoint "
            "to each offer costs); needs the daemon.",
        ),
    ] = None,
    api: ApiOption = None,
    output: OutputOption = None,
    wide_flag: WideOption = False,
) -> None:
    """List GPU offers, cheapest first, from the configured providers or a catalog file."""
    wide = wants_wide(output, wide_flag)
    as_json = as_json or output == "json"
    from optimizer import hardware
    from optimizer.catalog import CatalogError
    from optimizer.model import Market
    from optimizer.offers import OfferQuery, select
    from providers.snapshot import CatalogFileSource

    gpu_models: list[str] = []
    for name in gpu or []:
        spec = hardware.lookup(name)
        if spec is None:
            known = ", ".join(g.name for g in hardware.all_gpus())
            fail(f"--gpu: unknown GPU model {name!r}; known models: {known}")
        else:
            gpu_models.append(spec.name)

    from providers import registry

    providers = [p.lower() for p in provider or ()]
    for name in providers:
        if registry.find(name) is None:
            fail(f"--provider: unknown provider {name!r}; known: {', '.join(registry.names())}")
    query = OfferQuery(
        gpu_models=tuple(gpu_models),
        min_gpu_memory_gib=min_gpu_memory,
        min_gpus=gpus,
        region_globs=tuple(region or ()),
        providers=tuple(providers),
        market=Market(market.value.replace("-", "_")) if market else None,
        max_usd_per_hour=max_price,
    )
    when = None
    if at is not None:
        from optimizer.cli import ranked

        if policy is None:
            fail("--at needs --policy FILE")
        when = ranked.parse_at(at)
    commitments = query.market is Market.COMMITTED
    if job is not None:
        from optimizer.cli import ranked

        if catalog is not None:
            fail("--job ranks the daemon's live offers: leave out --catalog")
        arg = ranked.job_policy_arg(policy)
        ranked.show(
            arg, query, limit=limit, explain=explain, as_json=as_json, api=api,
            gather=lambda: ([], ""), at=when, job=job, wide=wide,
        )  # fmt: skip
        return
    if policy is not None and catalog is None:
        from optimizer.cli import ranked

        arg = ranked.policy_arg(policy)
        wants = commitments or (arg.policy is not None and _allows_committed(arg.policy))
        asked, rest = _policy_sources(providers, arg.policy)
        ranked.show(
            arg,
            query,
            limit=limit,
            explain=explain,
            as_json=as_json,
            api=api,
            gather=lambda: _gather(
                asked, region or (), commitments=wants, snapshot_for_rest=rest, at=when
            ),
            at=when,
            wide=wide,
        )
        return
    if catalog is not None:
        file_source = CatalogFileSource(catalog)
        try:
            rows = file_source.fetch_offers()
        except CatalogError as exc:
            fail(str(exc))
        source_name = file_source.name
    elif not providers and policy is None:
        rows, source_name = _daemon_or_snapshot(api, query, commitments=commitments)
    else:
        rows, source_name = _gather(providers, region or (), commitments=commitments)

    chosen = select(rows, query)
    if policy is not None:
        from optimizer.cli import ranked

        arg = ranked.policy_arg(policy)
        if arg.policy is None:
            fail(f"--policy {policy}: no such file")
        view = ranked.view_here(arg.policy, chosen, at=when)
        ranked.render(
            view, limit=limit, explain=explain, as_json=as_json, source=source_name, wide=wide
        )
        return
    if explain:
        fail("--explain needs --policy FILE")
    shown = chosen[:limit] if limit else chosen

    if as_json:
        json.dump([o.to_dict() for o in shown], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from optimizer.cli.tables import offers_table

    offers_table(shown, total=len(chosen), source=source_name, wide=wide)


DAEMON_PAGE = 1000  # the API's largest page


def _daemon_or_snapshot(
    api: str | None, query: OfferQuery, *, commitments: bool
) -> tuple[list[Offer], str]:
    """What `gpuopt offers` lists without --provider or --catalog: the latest offers of every
    provider the daemon polls (the local cloud included) when one answers; else the bundled
    snapshot, saying so on stderr."""
    from optimizer.answers import OfferList
    from optimizer.cli.client import NoDaemon, base_url, check, read, request, unreadable
    from optimizer.model import Offer

    rows: list[Offer] = []
    market = {} if query.market is None else {"market": query.market.value}
    offset = 0
    try:
        while True:
            params = {"limit": DAEMON_PAGE, "offset": offset, **market}
            page = read(OfferList, check(request("GET", "/offers", api, params=params)))
            try:
                rows.extend(Offer.from_dict(o) for o in page.offers)
            except (TypeError, ValueError, KeyError) as exc:
                unreadable(f"OfferList.offers: {exc}")
            offset += DAEMON_PAGE
            if offset >= page.count or not page.offers:
                break
    except NoDaemon as exc:
        print(f"gpuopt: no daemon ({exc}); showing the bundled snapshot", file=sys.stderr)
        return _gather([], (), commitments=commitments)
    polled = ", ".join(sorted({o.provider for o in rows})) or "no provider"
    return rows, f"daemon at {base_url(api)}: {polled}"


def _allows_committed(policy: Policy) -> bool:
    """Whether the policy lists the committed market, itself or in a schedule window."""
    windows = policy.schedule.windows if policy.schedule is not None else []
    return "committed" in policy.markets or any(
        w.markets is not None and "committed" in w.markets for w in windows
    )


def _policy_sources(providers: list[str], policy: Policy | None) -> tuple[list[str], bool]:
    """What a policy ranked here (no daemon) is ranked over, when no --provider says: the
    local cloud's own offers where the policy may use it (computed here, as the daemon's local
    cloud lists them), beside the snapshot for the clouds (never called unasked)."""
    if providers or policy is None or "local" not in policy.placement.providers:
        return providers, False
    return ["local"], True


def _gather(
    providers: list[str],
    regions: Sequence[str],
    *,
    commitments: bool = False,
    snapshot_for_rest: bool = False,
    at: datetime | None = None,
) -> tuple[list[Offer], str]:
    """The offers of the providers asked for (the snapshot when none), each source that
    could not run said in one line on stderr; committed offers are asked for only when
    `commitments` (the committed market is wanted): they take calls of their own."""
    from optimizer.cli.sources import gather

    gathered = gather(
        providers, regions, commitments=commitments, snapshot_for_rest=snapshot_for_rest, at=at
    )
    for note in gathered.notes:
        print(f"gpuopt: {note}", file=sys.stderr)
    return gathered.offers, ", ".join(gathered.names)
