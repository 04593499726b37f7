"""Deadline strategies on the public AWS V100 spot traces (docs/deadlines.md).

The set `availability/1-node/aws-02-15-2023` of github.com/skypilot-org/spot-traces (9 zones
of us-east-1, us-east-2 and us-west-2, p3.2xlarge, 45 days at 195-second ticks), given with
`--traces DIR` (or the env GPUOPT_SPOT_TRACES); the files are not kept in this repository.
48 h of work, deadlines 52 h and 70 h, restart overheads 0.05 h and 0.2 h, on-demand
$3.06/h (p3.2xlarge, us-east-1, AWS price list) and spot at 0.3 x on-demand; each trace on
its own (single zone) and the 9 as zones of one job (multi-zone), from `--starts` offsets
spread evenly over the trace after its first 7 days (so that every start has a week of
market history behind it, as a daemon that has watched the markets would). For each
setting: the mean cost / on-demand-only cost of gpuopt, uniform-progress, greedy and the
offline optimum, the deadlines missed, and the share of greedy's gap to the optimum each
strategy closes (computed on the means).
Prints the table and writes bench/results/deadlines.json and bench/results/deadlines.md.

    python -m bench.deadlines --traces DIR [--starts 80]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from policies.deadline import TraceError, optimum, read_traces, replay, strategy
from policies.deadline.traces import Trace

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
HOUR = 3600
WORK_H = 48.0
DEADLINES_H = (52.0, 70.0)
OVERHEADS_H = (0.05, 0.2)
ON_DEMAND = 3.06  # p3.2xlarge on-demand USD/h, us-east-1 (AWS price list; REFERENCE-ROUND3)
SPOT = 0.3 * ON_DEMAND  # the ratio the deadline literature uses for V100 spot
STRATEGIES = ("gpuopt", "uniform-progress", "greedy")
WARMUP_S = 7 * 86400  # starts leave the trace's first week as market history
# The paper's own Uniform Progress figures are not quoted: the paper's tables could not be
# checked here (docs/deadlines.md).
PAPER = "not checked here: see docs/deadlines.md"


def start_ticks(trace: Trace, deadline_s: float, starts: int) -> list[int]:
    first = int(WARMUP_S // trace.gap_s)
    last = max(first, len(trace.counts) - int(-(-deadline_s // trace.gap_s)))
    return sorted({first + j * (last - first) // starts for j in range(starts)})


def run_setting(
    groups: list[list[Trace]], deadline_h: float, overhead_h: float, starts: int
) -> dict[str, Any]:
    ratios: dict[str, list[float]] = {name: [] for name in (*STRATEGIES, "optimum")}
    misses = dict.fromkeys(STRATEGIES, 0)
    infeasible = 0
    for group in groups:
        for tick in start_ticks(group[0], deadline_h * HOUR, starts):
            job: dict[str, Any] = dict(
                start_tick=tick,
                work_s=WORK_H * HOUR,
                deadline_s=deadline_h * HOUR,
                overhead_s=overhead_h * HOUR,
                spot_price=SPOT,
                on_demand_price=ON_DEMAND,
            )
            best = optimum(group, **job)
            if best is None:
                infeasible += 1
                continue
            base = (WORK_H + overhead_h) * ON_DEMAND
            ratios["optimum"].append(best / base)
            for name in STRATEGIES:
                out = replay(strategy(name), group, **job)
                ratios[name].append(out.cost_usd / base)
                misses[name] += not out.deadline_met
    mean = {name: statistics.fmean(values) for name, values in ratios.items()}
    gap = mean["greedy"] - mean["optimum"]
    closed = {
        name: None if gap < 1e-9 else (mean["greedy"] - mean[name]) / gap
        for name in ("gpuopt", "uniform-progress")
    }
    return {
        "deadline_h": deadline_h,
        "overhead_h": overhead_h,
        "replays": len(ratios["optimum"]),
        "infeasible": infeasible,
        "mean_cost_over_on_demand": {k: round(v, 4) for k, v in mean.items()},
        "misses": misses,
        "greedy_gap_closed": {k: None if v is None else round(v, 3) for k, v in closed.items()},
        "gpuopt_over_optimum": round(mean["gpuopt"] / mean["optimum"] - 1, 4),
        "worst_gpuopt_over_optimum": round(
            max(g / o - 1 for g, o in zip(ratios["gpuopt"], ratios["optimum"], strict=True)), 4
        ),
    }


def markdown(rows: list[dict[str, Any]], starts: int, source: str) -> str:
    out = [
        f"48 h of work on the spot traces of {source}, {starts} starts per "
        "trace after its first 7 days; mean cost / on-demand-only cost (lower is better); "
        "gap closed = share of greedy's gap to the optimum closed. Paper's Uniform Progress "
        "figures: not checked here (docs/deadlines.md).",
        "",
        "| zones | deadline | overhead | gpuopt | uniform-progress | greedy | optimum | misses "
        "(gpuopt/UP/greedy) | gap closed gpuopt | gap closed UP | gpuopt vs optimum |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, c = r["mean_cost_over_on_demand"], r["greedy_gap_closed"]
        pct = lambda v: "n/a (no gap)" if v is None else f"{v:.0%}"  # noqa: E731
        misses = "/".join(str(r["misses"][k]) for k in STRATEGIES)
        out.append(
            f"| {r['zones']} | {r['deadline_h']:g} h | {r['overhead_h']:g} h | "
            f"{m['gpuopt']:.3f} | {m['uniform-progress']:.3f} | {m['greedy']:.3f} | "
            f"{m['optimum']:.3f} | {misses} | {pct(c['gpuopt'])} | "
            f"{pct(c['uniform-progress'])} | +{r['gpuopt_over_optimum']:.1%} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=os.environ.get("GPUOPT_SPOT_TRACES"))
    parser.add_argument("--starts", type=int, default=80)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.traces is None:
        print(
            "give --traces DIR (or GPUOPT_SPOT_TRACES): the aws-02-15-2023 traces", file=sys.stderr
        )
        return 2
    try:
        traces = read_traces(args.traces)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started, cpu = time.monotonic(), time.process_time()
    rows = []
    for deadline_h in DEADLINES_H:
        for overhead_h in OVERHEADS_H:
            for zones, groups in (("single", [[t] for t in traces]), ("multi", [traces])):
                row = {"zones": zones, **run_setting(groups, deadline_h, overhead_h, args.starts)}
                rows.append(row)
                m, c = row["mean_cost_over_on_demand"], row["greedy_gap_closed"]
                print(
                    f"{zones:<6} D {deadline_h:g} h o {overhead_h:g} h: gpuopt {m['gpuopt']:.3f} "
                    f"UP {m['uniform-progress']:.3f} greedy {m['greedy']:.3f} optimum "
                    f"{m['optimum']:.3f}  misses {row['misses']}  closed {c}",
                    flush=True,
                )
    result = {
        "traces": sorted(t.name for t in traces),
        "work_h": WORK_H,
        "on_demand_usd_per_hour": ON_DEMAND,
        "spot_usd_per_hour": SPOT,
        "starts_per_trace": args.starts,
        "paper_uniform_progress": PAPER,
        "settings": rows,
        "wall_s": round(time.monotonic() - started, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "deadlines.json").write_text(json.dumps(result, indent=2) + "\n")
    source = (
        f"{Path(args.traces).name} ({len(traces)} zones: "
        + ", ".join(sorted(t.zone for t in traces))
        + ")"
    )
    table = markdown(rows, args.starts, source)
    (args.out / "deadlines.md").write_text(table)
    print(table)
    print(f"wall {result['wall_s']} s, cpu {result['cpu_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
