"""`gpuopt tco --chart`: cumulative cost per option over the horizon, as SVG or PNG.

matplotlib is an optional extra (`pip install 'gpuopt[chart]'`): without it `--chart` says
so and the rest of `gpuopt tco` works as before.
"""

from __future__ import annotations

from pathlib import Path

from optimizer.costs.tco import Comparison


class ChartUnavailable(RuntimeError):
    """The plotting library is not installed."""


def write_chart(result: Comparison, path: Path) -> None:
    """Plot every option's cumulative USD by month and write it to `path` (.svg or .png)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: write files only
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        raise ChartUnavailable(
            "matplotlib is not installed (pip install 'gpuopt[chart]')"
        ) from None
    usage = result.usage
    figure = Figure(figsize=(9, 5.5))
    axes = figure.subplots()
    months = list(range(usage.months + 1))
    for option in sorted(result.options, key=lambda o: o.total(usage.hours_per_month)):
        label = f"{option.name} (${option.cumulative_usd[-1]:,.0f})"
        style = "--" if option.kind.value == "mix" else "-"
        axes.step(months, option.cumulative_usd, where="post", linestyle=style, label=label)
    axes.set_xlabel("month")
    axes.set_ylabel("cumulative cost, USD")
    axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:,.0f}"))
    axes.set_title(
        f"{usage.gpus}x {usage.gpu_model}, {usage.hours_per_month:g} h/month, "
        f"{usage.years} year(s): cheapest {result.cheapest.name}"
    )
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    # A fixed creation date keeps the SVG the same for the same figures.
    metadata = {"Date": None} if path.suffix.lower() == ".svg" else {}
    figure.savefig(path, metadata=metadata)
