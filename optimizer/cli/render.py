"""Rich tables for the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from optimizer.model import Offer

if TYPE_CHECKING:
    from optimizer.cli.ranking_view import RankingView
    from policies.engine import Candidate


def offers_table(offers: Sequence[Offer], *, total: int, source: str) -> None:
    console = Console()
    if not console.is_terminal:
        # Piped or captured output has no width to fit; never truncate a price or a name.
        console = Console(width=250)
    if not offers:
        console.print(f"No offers match (source: {source}).")
        return
    table = Table(title=f"{len(offers)} of {total} offers, cheapest first (source: {source})")
    for header, justify in (
        ("provider", "left"),
        ("region", "left"),
        ("zone", "left"),
        ("instance type", "left"),
        ("GPU", "left"),
        ("GPUs", "right"),
        ("GiB/GPU", "right"),
        ("vCPUs", "right"),
        ("RAM GiB", "right"),
        ("link", "left"),
        ("market", "left"),
        ("$/h", "right"),
        ("$/GPU-h", "right"),
    ):
        table.add_column(
            header,
            justify="right" if justify == "right" else "left",
            no_wrap=header in ("instance type", "$/h"),
        )
    for o in offers:
        table.add_row(
            o.provider,
            o.region,
            o.zone or "-",
            o.instance_type,
            o.gpu_model,
            str(o.gpu_count),
            f"{o.gpu_memory_gib:.1f}",
            str(o.vcpus),
            f"{o.ram_gib:g}",
            o.interconnect.value,
            o.market.value,
            f"{o.usd_per_hour:.4f}" + (" sim" if o.source == "simulated" else ""),
            f"{o.usd_per_gpu_hour:.4f}",
        )
    console.print(table)
    if any(o.source == "simulated" for o in offers):
        console.print("sim: a simulated price (the local cloud's), not a quote")


def ranking_table(ranking: RankingView, *, limit: int, explain: bool, source: str) -> None:
    """Ranked candidates of a policy evaluation and, with `explain`, its rejections by rule."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=250)
    shown = ranking.candidates[:limit] if limit else ranking.candidates
    title = (
        f"policy {ranking.policy_name}: {ranking.candidate_count} of {ranking.total} offers "
        f"qualify, best first (source: {source})"
    )
    if ranking.window is not None:
        console.print(f"Ranked under schedule window {ranking.window}, in force at {ranking.at}.")
    if ranking.cooling_down:
        console.print(
            f"{ranking.cooling_down} offers left out: their pools are in cooldown after a "
            "failed or interrupted launch, and a launch would not use them now."
        )
    if not shown:
        why = "the rejections by rule follow." if explain else "run with --explain to see why."
        console.print(f"{title}\nNo offer meets the policy; {why}")
    else:
        table = Table(title=title)
        per_tflop = any(c.usd_per_tflop_hour is not None for c in shown)
        per_tbps = any(
            c.usd_per_tbps_hour is not None and c.score == c.usd_per_tbps_hour for c in shown
        )
        sources = per_tflop or per_tbps or any(_measured(c) or c.probe_failures for c in shown)
        headers = [
            "#", "provider", "region", "zone", "instance type", "GPUs", "GiB/GPU", "headroom",
            "market", "$/h", "$/GPU-h",
        ]  # fmt: skip
        if per_tflop:
            headers += [f"{ranking.dtype} TFLOPS", "$/TFLOP-h"]
        if per_tbps:
            headers += ["mem TB/s", "$/TB/s-h"]
        risky = any(c.expected_usd_per_hour is not None for c in shown)
        if risky:
            headers += ["p/h", "p from", "exp $/h"]
        moving = any(c.move is not None for c in shown)
        if moving:
            headers += ["move $/h", "moving the job's state"]
        stepping = any(c.speed_basis is not None for c in shown)
        if stepping:
            headers += ["steps/h", "$/1k steps", "speed from"]
        if sources:
            headers += ["figures"]
        for header in headers:
            table.add_column(header, justify="left" if header[0].isalpha() else "right")
        for c in shown:
            o = c.offer
            headroom = "-" if c.memory_headroom is None else f"{c.memory_headroom:+.0%}"
            row = [
                str(c.rank), o.provider, o.region, o.zone or "-", o.instance_type,
                f"{o.gpu_count}x {o.gpu_model}", f"{o.gpu_memory_gib:.1f}", headroom,
                o.market.value, f"{o.usd_per_hour:.4f}", f"{c.usd_per_gpu_hour:.4f}",
            ]  # fmt: skip
            if per_tflop:
                row += [
                    "-"
                    if c.node_tflops is None
                    else f"{c.node_tflops:,.{0 if c.node_tflops >= 100 else 1}f}",
                    "-" if c.usd_per_tflop_hour is None else f"{c.usd_per_tflop_hour:.5f}",
                ]
            if per_tbps:
                row += [
                    "-" if c.node_tbps is None else f"{c.node_tbps:,.2f}",
                    "-" if c.usd_per_tbps_hour is None else f"{c.usd_per_tbps_hour:.4f}",
                ]
            if risky:
                row += expected_cells(c)
            if moving:
                row += move_cells(c)
            if stepping:
                row += step_cells(c)
            if sources:
                row.append(figures(c))
            table.add_row(*row)
        console.print(table)
    if explain:
        _rejections(console, ranking)


def expected_cells(c: Candidate) -> list[str]:
    """p per hour, where it came from (and a recent interruption), and the expected $/h."""
    if c.expected_usd_per_hour is None or c.interruption_p is None:
        return ["-", "-", "-"]
    source = c.interruption_source or "-"
    if c.risk:
        source += f"; {c.risk}"
    return [f"{c.interruption_p:.3g}", source, f"{c.expected_usd_per_hour:.4f}"]


def move_cells(c: Candidate) -> list[str]:
    """The move of the job's state to the offer, spread per hour, and in words."""
    if c.move_usd_per_hour is None:
        return ["-", "-"]
    return [f"{c.move_usd_per_hour:.4f}", c.move or "-"]


def step_cells(c: Candidate) -> list[str]:
    """The job's steps per hour on the offer, USD per thousand steps, and where the speed
    came from (`job`, `probe`, `datasheet`) with its basis in words."""
    if c.steps_per_hour is None or c.usd_per_step is None:
        return ["-", "-", c.speed_basis or "-"]
    return [
        f"{c.steps_per_hour:,.0f}",
        f"{c.usd_per_step * 1000:.4f}",
        f"{c.speed_source}: {c.speed_basis}",
    ]


def _measured(c: Candidate) -> bool:
    return "measured" in (c.throughput, c.bandwidth)


def figures(c: Candidate) -> str:
    """Where a candidate's throughput figures came from: `measured (n=5, 2.0 h old)` when its
    type's probes measured them, else `datasheet`; `demoted` when its probes keep failing."""
    if _measured(c) and c.measured_n is not None and c.measured_age_s is not None:
        text = f"measured (n={c.measured_n}, {c.measured_age_s / 3600:.1f} h old)"
    elif _measured(c):
        text = "measured"
    else:
        text = "datasheet" if c.throughput or c.bandwidth else "-"
    return f"{text}; demoted: probes failing" if c.probe_failures else text


def _rejections(console: Console, ranking: RankingView, examples: int = 3) -> None:
    by_rule = ranking.rejections_by_rule()
    if not by_rule:
        console.print("No offer was rejected.")
        return
    total = sum(ranking.rejection_counts.values())
    table = Table(title=f"{total} rejected offers, by the first rule they failed")
    table.add_column("rule")
    table.add_column("offers", justify="right")
    table.add_column("examples")
    for rule, rejected in by_rule.items():
        count = ranking.rejection_counts.get(rule, len(rejected))
        lines = [
            f"{r.offer.instance_type} {r.offer.region} {r.offer.market.value}: {r.reason}"
            for r in rejected[:examples]
        ]
        if count > examples:
            lines.append(f"… and {count - min(examples, len(rejected))} more")
        table.add_row(rule, str(count), "\n".join(lines))
    console.print(table)


def columns(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[str] = ()
) -> None:
    """Rows under upper-case headers in aligned columns without borders (a listing, as
    `kubectl get` prints one). On a terminal the last column wraps to fit; piped output is
    never wrapped or cut, and carries no trailing spaces."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for i, header in enumerate(headers):
        last = i == len(headers) - 1
        table.add_column(
            header,
            justify="right" if header in right else "left",
            no_wrap=not last,
            overflow="fold" if last else "ellipsis",
        )
    for row in rows:
        table.add_row(*row)
    console = Console()
    if console.is_terminal:
        console.print(table)
        return
    wide = Console(width=10_000, color_system=None)
    with wide.capture() as captured:
        wide.print(table)
    for line in captured.get().splitlines():
        print(line.rstrip())


def _usd(value: float) -> str:
    return f"{value:,.2f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.2f}"


def costs_table(
    groups: Sequence[dict[str, Any]], totals: dict[str, Any], *, by: str, note: str
) -> None:
    """`gpuopt costs`: one row per group, a totals row, and the savings line under it."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=250)
    if not groups:
        console.print("No costs in this window.")
        return
    table = Table(title=f"Costs by {by} (USD; hours billed)", show_footer=False)
    table.add_column(by, no_wrap=True)
    for header in (
        "spend",
        "storage",
        "on-demand",
        "saved",
        "saved %",
        "net %",
        "billed h",
        "overhead h",
        "overhead",
        "attempts",
    ):
        table.add_column(header, justify="right", no_wrap=True)

    def cells(row: dict[str, Any]) -> list[str]:
        known = "" if row.get("baseline_known", True) else "*"
        return [
            _usd(row["spend_usd"]),
            _usd(row["storage_usd"]),
            _usd(row["on_demand_usd"]) + known,
            _usd(row["savings_usd"]),
            _share(row["savings_fraction"]),
            _share(row["net_savings_fraction"]),
            _hours(row["billed_seconds"]),
            _hours(row["overhead_seconds"]),
            _usd(row["overhead_usd"]),
            str(row.get("attempt_count", "")),
        ]

    for row in groups:
        table.add_row(str(row["group"]), *cells(row))
    table.add_section()
    table.add_row("total", *cells(totals), style="bold")
    console.print(table)
    if not totals.get("baseline_known", True):
        console.print("* some attempts had no on-demand price of their type and region")
    spares = [
        a for row in groups for a in row.get("attempts") or () if a.get("role") == "warm_spare"
    ]
    if spares:  # (attempts are listed by job only)
        spent = sum(float(a["total_usd"]) for a in spares)
        hours = sum(float(a["billed_seconds"]) for a in spares) / 3600
        console.print(
            f"of which warm spares (idle, beside the running attempts): {_usd(spent)} over "
            f"{hours:.2f} h billed, {len(spares)} spare attempt(s)"
        )
    console.print(note)
