"""The console's GPU-model price chart at scale: one GPU model's pools across regions, read in
a chart's buckets (`store.prices.price_buckets`, what /ui/data/prices/gpu reads) against
reading every point of them (`store.prices.price_histories`).

Builds `--pools` pools of one GPU model (320 by default: 20 regions, each with 4 instance
types on spot in 3 zones and on-demand per region) with a price every 10 minutes for `--days`
days (30: 1.38 million points), then runs the first retention pass at the end of the data,
so that the days past the raw retention (14) are hourly rows and the rest raw points, as in
a daemon's store. Then, for windows of 2, 7, 14 and 30 days ending there:

- buckets: the grid the console picks (at most 300 buckets), every pool read through
  `price_buckets` and the chart's lines built (`optimizer.ui.gpu_prices.series`, spot and
  on-demand per region, a policy's bid cap as a fraction of on-demand): seconds (wall and
  CPU of this process), rows the database returned, points per line;
- every point: the same pools' points in effect over the window through `price_histories`
  (one connection, both tiers): seconds and rows.

Each is the median of `--repeat` runs. Prints figures and writes
bench/results/console_prices.json.

    python -m bench.console_prices [--pools 320] [--days 30] [--repeat 5]
        [--database-url postgresql://…] [--skip-sqlite]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.prices_retention import (
    START,
    Engine,
    data_options,
    engines,
    first_pass,
    load_timed,
    parse_data_options,
    report_head,
    write_report,
)
from optimizer.model import Interconnect, Market, Offer
from optimizer.store import Grid
from optimizer.ui.gpu_prices import MAX_POINTS, series
from policies.schema import Policy

RESULTS = Path(__file__).resolve().parent / "results" / "console_prices.json"
WINDOWS_DAYS = (2, 7, 14, 30)
TYPES = (("g6.xlarge", 1), ("g6.12xlarge", 4), ("g6.24xlarge", 4), ("g6.48xlarge", 8))
ZONES = ("a", "b", "c")
POOLS_PER_REGION = len(TYPES) * (len(ZONES) + 1)
POLICY = Policy.model_validate(
    {
        "apiVersion": "gpuopt/v1",
        "kind": "Policy",
        "name": "bench",
        "workload": {"gpus": 1},
        "bid": {"max_fraction_of_on_demand": 0.7},
    }
)


def model_offers(count: int) -> list[Offer]:
    """The pools of one GPU model (L4) over count // POOLS_PER_REGION regions, as offers."""
    out: list[Offer] = []
    for r in range(max(1, count // POOLS_PER_REGION)):
        region = f"bench-region-{r}"
        for instance_type, gpus in TYPES:
            for zone in (*(f"{region}{z}" for z in ZONES), None):
                out.append(
                    Offer(
                        provider="aws",
                        region=region,
                        zone=zone,
                        instance_type=instance_type,
                        gpu_model="L4",
                        gpu_count=gpus,
                        gpu_memory_gib=24.0,
                        vcpus=4 * gpus,
                        ram_gib=16.0 * gpus,
                        interconnect=Interconnect.NONE,
                        market=Market.ON_DEMAND if zone is None else Market.SPOT,
                        usd_per_hour=1.0,
                        observed_at=START,
                        source="bench",
                    )
                )
    return out


def timed(work: Callable[[], Any], repeat: int) -> tuple[Any, float, float]:
    """(the last result, median wall seconds, median CPU seconds of this process)."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return result, statistics.median(walls), statistics.median(cpus)


def window(engine: Engine, offers: Sequence[Offer], end: Any, days: int, repeat: int) -> dict:
    store = engine.store
    since = end - timedelta(days=days)
    grid = Grid.over(since, end, MAX_POINTS)
    pools = [o.pool for o in offers]

    def chart() -> tuple[dict[str, Any], int]:
        found = store.prices.price_buckets(pools, grid)
        columns = dict(zip(pools, found, strict=True))
        rows = sum(1 for column in found for cell in column if cell is not None)
        return series(grid, offers, [], columns, POLICY), rows

    (lines, cells), wall, cpu = timed(chart, repeat)
    every, all_wall, all_cpu = timed(
        lambda: store.prices.price_histories([(p, since, end) for p in pools], prior=True),
        repeat,
    )
    points = sum(len(h) for h in every)
    out = {
        "window_days": days,
        "bucket_s": grid.width_s,
        "lines": len(lines["series"]) + len(lines["caps"]),
        "points_per_line": grid.count,
        "buckets": {"seconds": round(wall, 4), "cpu_seconds": round(cpu, 4), "cells": cells},
        "every_point": {
            "seconds": round(all_wall, 4),
            "cpu_seconds": round(all_cpu, 4),
            "points": points,
        },
    }
    print(
        f"{engine.name:<10} {days:>2} days: {grid.count} x {grid.width_s} s buckets, "
        f"{out['lines']} lines: {wall * 1000:.0f} ms ({cpu * 1000:.0f} ms CPU); "
        f"every point ({points:,}): {all_wall * 1000:.0f} ms ({all_cpu * 1000:.0f} ms CPU)"
    )
    return out


def run(make: Callable[[], Any], offers: Sequence[Offer], args: Any) -> dict[str, Any]:
    with make() as engine:
        pools = [(*o.pool[:2], o.pool[2] or "", o.pool[3], o.pool[4].value) for o in offers]
        points, load_s = load_timed(engine, pools, args.days)
        end = START + timedelta(days=args.days)
        pruned = first_pass(engine.store, end, args)
        print(f"{engine.name:<10} retention pass: {pruned['seconds']:.1f} s")
        return {
            "engine": engine.name,
            "points_loaded": points,
            "load_seconds": round(load_s, 1),
            "hourly_rows_written": pruned["hourly_rows_written"],
            "windows": [window(engine, offers, end, d, args.repeat) for d in WINDOWS_DAYS],
        }


def main(argv: Sequence[str] | None = None) -> None:
    parser = data_options(__doc__.splitlines()[0], RESULTS)
    parser.set_defaults(pools=320)
    parser.add_argument("--repeat", type=int, default=5)
    args = parse_data_options(parser, argv)
    offers = model_offers(args.pools)
    print(f"{len(offers)} pools x {args.days} days of 10-minute points")
    results = [run(make, offers, args) for make in engines(args)]
    command = (
        f"python -m bench.console_prices --pools {args.pools} --days {args.days} "
        f"--repeat {args.repeat}"
    )
    report = report_head("console_prices", command, args, len(offers))
    report["max_points_per_line"] = MAX_POINTS
    report["results"] = results
    write_report(report, args.output)


if __name__ == "__main__":
    main()
