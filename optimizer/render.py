"""Rich tables for the CLI."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from optimizer.model import Offer


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
        table.add_column(header, justify=justify, no_wrap=header in ("instance type", "$/h"))
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
            f"{o.usd_per_hour:.4f}",
            f"{o.usd_per_gpu_hour:.4f}",
        )
    console.print(table)
