"""The CLI's domain tables (offers, a policy's ranking, costs), laid out by
`optimizer.cli.render` so that each fits a terminal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from optimizer.cli.render import Column, say, table
from optimizer.model import Offer

if TYPE_CHECKING:
    from optimizer.cli.ranking_view import RankingView
    from policies.engine import Candidate


# Key columns whose widest values (a GCP type such as `n1-standard-8+nvidia-tesla-t4:1`)
# would not fit 80 columns together give way last (drop 1): the provider (its type and region
# name it), the GPU count and the per-GPU price.
OFFER_COLUMNS = [
    Column("provider", drop=1),
    Column("region", key=True),
    Column("zone", drop=4),
    Column("instance type", key=True),
    Column("GPU", drop=2),
    Column("GPUs", right=True, drop=1),
    Column("GiB/GPU", right=True, drop=3),
    Column("vCPUs", right=True, drop=5),
    Column("RAM GiB", right=True, drop=5),
    Column("link", drop=5),
    Column("market", key=True),
    Column("$/h", right=True, key=True),
    Column("$/GPU-h", right=True, drop=1),
]


def offers_table(offers: Sequence[Offer], *, total: int, source: str, wide: bool = False) -> None:
    if not offers:
        print(f"No offers match (source: {source}).")
        return
    rows = [
        [
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
        ]
        for o in offers
    ]
    title = f"{len(offers)} of {total} offers, cheapest first (source: {source})"
    table(OFFER_COLUMNS, rows, title=title, wide=wide)
    if any(o.source == "simulated" for o in offers):
        say("sim: a simulated price (the local cloud's), not a quote", wide=wide)


# The ranking's columns beyond the first ones, by header: how each gives way.
_RANKED: dict[str, Column] = {
    c.header: c
    for c in (
        Column("#", right=True, key=True),
        Column("provider", drop=1),
        Column("region", key=True),
        Column("zone", drop=5),
        Column("instance type", key=True),
        Column("GPUs", drop=1),
        Column("GiB/GPU", right=True, drop=4),
        Column("headroom", right=True, drop=4),
        Column("market", key=True),
        Column("$/h", right=True, key=True),
        Column("$/GPU-h", right=True, drop=1),
        Column("TFLOPS", right=True, drop=3),
        Column("$/TFLOP-h", right=True, drop=2),
        Column("mem TB/s", right=True, drop=3),
        Column("$/TB/s-h", right=True, drop=2),
        Column("p/h", right=True, drop=3),
        Column("p from", drop=6, cut=True),
        Column("exp $/h", right=True, drop=2),
        Column("move $/h", right=True, drop=3),
        Column("moving the job's state", drop=6, cut=True),
        Column("steps/h", right=True, drop=3),
        Column("$/1k steps", right=True, drop=2),
        Column("speed from", drop=6, cut=True),
        Column("figures", drop=6, cut=True),
    )
}


def _ranked_column(header: str) -> Column:
    if header.endswith(" TFLOPS"):  # `bf16 TFLOPS`: the dtype's
        return Column(header, right=True, drop=3)
    return _RANKED[header]


def _score_header(shown: Sequence[Candidate]) -> str | None:
    """The column the candidates are ranked by (their score): kept whole at any width."""

    def close(a: float | None, b: float) -> bool:
        return a is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))

    figures = (
        ("exp $/h", lambda c: c.expected_usd_per_hour),
        ("$/1k steps", lambda c: c.usd_per_step),
        ("$/TFLOP-h", lambda c: c.usd_per_tflop_hour),
        ("$/TB/s-h", lambda c: c.usd_per_tbps_hour),
        ("$/GPU-h", lambda c: c.usd_per_gpu_hour),
    )
    for header, value in figures:
        if all(close(value(c), c.score) for c in shown):
            return header
    return None


def ranking_table(
    ranking: RankingView, *, limit: int, explain: bool, source: str, wide: bool = False
) -> None:
    """Ranked candidates of a policy evaluation and, with `explain`, its rejections by rule."""
    shown = ranking.candidates[:limit] if limit else ranking.candidates
    title = (
        f"policy {ranking.policy_name}: {ranking.candidate_count} of {ranking.total} offers "
        f"qualify, best first (source: {source})"
    )
    if ranking.window is not None:
        say(f"Ranked under schedule window {ranking.window}, in force at {ranking.at}.", wide=wide)
    if ranking.cooling_down:
        n = ranking.cooling_down
        say(
            f"{n} offers left out: their pools are in cooldown after a failed or interrupted "
            "launch, and a launch would not use them now."
            if n > 1
            else "1 offer left out: its pool is in cooldown after a failed or interrupted "
            "launch, and a launch would not use it now.",
            wide=wide,
        )
    if not shown:
        why = "the rejections by rule follow." if explain else "run with --explain to see why."
        print(f"{title}\nNo offer meets the policy; {why}")
    else:
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
        rows = []
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
            rows.append(row)
        ranked_by = _score_header(shown)
        spec = [_ranked_column(h) for h in headers]
        spec = [replace(c, key=True) if c.header == ranked_by else c for c in spec]
        table(spec, rows, title=title, wide=wide)
    if explain:
        _rejections(ranking, wide=wide)


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


def _rejections(ranking: RankingView, examples: int = 3, *, wide: bool = False) -> None:
    by_rule = ranking.rejections_by_rule()
    if not by_rule:
        print("No offer was rejected.")
        return
    total = sum(ranking.rejection_counts.values())
    rows = []
    for rule, rejected in by_rule.items():
        count = ranking.rejection_counts.get(rule, len(rejected))
        lines = [
            f"{r.offer.instance_type} {r.offer.region} {r.offer.market.value}: {r.reason}"
            for r in rejected[:examples]
        ]
        if count > examples:
            lines.append(f"… and {count - min(examples, len(rejected))} more")
        rows.append([rule, str(count), "\n".join(lines)])
    header = [Column("rule", key=True), Column("offers", right=True, key=True)]
    title = f"{total} rejected offers, by the first rule they failed"
    table([*header, Column("examples", cut=True, drop=0)], rows, title=title, wide=wide)


def _usd(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


_USD_FIGURES = ("spend_usd", "storage_usd", "on_demand_usd", "savings_usd", "overhead_usd")


def usd_digits(rows: Sequence[dict[str, Any]]) -> int:
    """Decimals for every amount of a table, rows and totals alike: cents, or four where an
    amount under a dollar would read 0.00 beside a total that does not (a few minutes of a
    cheap spot instance), so the rows shown add up to the total shown."""
    small = any(0 < abs(float(row.get(name) or 0)) < 0.995 for row in rows for name in _USD_FIGURES)
    return 4 if small else 2


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.2f}"


COST_COLUMNS = [
    Column("spend", right=True, key=True),
    Column("storage", right=True, drop=3),
    Column("on-demand", right=True, key=True),
    Column("saved", right=True, key=True),
    Column("saved %", right=True, drop=2),
    Column("net %", right=True, drop=2),
    Column("billed h", right=True, drop=4),
    Column("overhead h", right=True, drop=5),
    Column("overhead", right=True, drop=4),
    Column("attempts", right=True, drop=3),
]


def costs_table(
    groups: Sequence[dict[str, Any]],
    totals: dict[str, Any],
    *,
    by: str,
    note: str,
    wide: bool = False,
) -> None:
    """`gpuopt costs`: one row per group, a totals row, and the savings line under it."""
    if not groups:
        print("No costs in this window.")
        return

    digits = usd_digits([*groups, totals])

    def cells(row: dict[str, Any]) -> list[str]:
        known = "" if row.get("baseline_known", True) else "*"
        return [
            _usd(row["spend_usd"], digits),
            _usd(row["storage_usd"], digits),
            _usd(row["on_demand_usd"], digits) + known,
            _usd(row["savings_usd"], digits),
            _share(row["savings_fraction"]),
            _share(row["net_savings_fraction"]),
            _hours(row["billed_seconds"]),
            _hours(row["overhead_seconds"]),
            _usd(row["overhead_usd"], digits),
            str(row.get("attempt_count", "")),
        ]

    table(
        [Column(by, key=True), *COST_COLUMNS],
        [[str(row["group"]), *cells(row)] for row in groups],
        title=f"Costs by {by} (USD; hours billed)",
        footer=[["total", *cells(totals)]],
        wide=wide,
    )
    if not totals.get("baseline_known", True):
        say("* some attempts had no on-demand price of their type and region", wide=wide)
    spares = [
        a for row in groups for a in row.get("attempts") or () if a.get("role") == "warm_spare"
    ]
    if spares:  # (attempts are listed by job only)
        spent = sum(float(a["total_usd"]) for a in spares)
        hours = sum(float(a["billed_seconds"]) for a in spares) / 3600
        say(
            f"of which warm spares (idle, beside the running attempts): {spent:,.2f} over "
            f"{hours:.2f} h billed, {len(spares)} spare attempt(s)",
            wide=wide,
        )
    say(note, wide=wide)
