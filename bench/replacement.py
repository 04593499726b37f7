"""The decision to move running jobs, at scale: 1,000 running jobs, a price change on 100 pools.

A SQLite store (in a temporary folder) holds the local cloud's offers in every region (the
bundled snapshot's on-demand rows and two simulated spot zones each) with two hours of
10-minute price history, four policies with `migration.enabled` (T4, 24 GB, 48 GB and 40 GB+
GPUs, each with a bid cap), and 1,000 jobs running on their policies' cheapest spot pools, one
attempt each. Then one poll's worth of prices lands in which 100 of the jobs' pools changed:
30 jump over their policy's cap, 70 rise by half (which makes other offers cheaper than them
by more than `min_savings`, though not for `min_stable`). Timed, each `--repeat` times:

- **the pass** (the headline): what each reconcile pass runs to decide, from the store —
  `migration_inputs.gather` (the live jobs' attempts are read by the reconciler anyway and
  are handed in, as it does; the latest offers, probe figures, each policy ranked, each
  running pool's rule, the candidate pools' price history, cooldowns, the ledger's overhead,
  read fresh every time) and `migration.plan`;
- **plan** alone, the pure function over what was gathered.

Target (issue): the pass <= 200 ms. Writes bench/results/replacement.json.

    python -m bench.replacement [--jobs 1000] [--changed 100] [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.replacement", *sys.argv[1:]])

from dataclasses import replace  # noqa: E402

from optimizer.jobs.migration import Reason, plan  # noqa: E402
from optimizer.jobs.migration_inputs import Overheads, gather  # noqa: E402
from optimizer.jobs.ranking import pool_of  # noqa: E402
from optimizer.model import Market, Offer  # noqa: E402
from optimizer.store import Store  # noqa: E402
from optimizer.store.jobs import token_sha256  # noqa: E402
from policies.engine import evaluate  # noqa: E402
from policies.loader import parse_policy  # noqa: E402
from providers.local import LocalCloud  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "replacement.json"
T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
TARGET_MS = 200.0

POLICIES = {
    "t4": ("{gpus: 1, gpu_memory_gib: 12, gpu_models: [T4]}", 1.5),
    "mid": ("{gpus: 1, gpu_memory_gib: 18}", 2.0),
    "big": ("{gpus: 1, gpu_memory_gib: 36}", 6.0),
    "multi": ("{gpus: 4, gpu_memory_gib: 12}", 12.0),
}


def policy_text(name: str, workload: str, cap: float) -> str:
    return (
        f"apiVersion: gpuopt/v1\nkind: Policy\nname: {name}\nworkload: {workload}\n"
        f"markets: [spot, on_demand]\nplacement: {{providers: [local]}}\n"
        f"bid: {{max_usd_per_hour: {cap}}}\n"
        "migration: {enabled: true, disruption_budget: 20}\n"
    )


def build(folder: Path, jobs: int, changed: int) -> tuple[Store, dict[str, Any], datetime]:
    """The store, the policies and `now`, with the price change recorded."""
    store = Store(f"sqlite:///{folder / 'bench.db'}")
    store.create_all()
    state = folder / "local-cloud"
    for minutes in range(-120, 1, 10):  # two hours of polls, 10 minutes apart
        at = (T0 + timedelta(minutes=minutes)).timestamp()
        store.prices.record_offers(LocalCloud(state, clock=lambda at=at: at).fetch_offers())
    policies = {n: parse_policy(policy_text(n, w, cap)) for n, (w, cap) in POLICIES.items()}
    offers = store.prices.latest_offers()
    placed: list[tuple[str, Offer]] = []
    per_policy = jobs // len(policies)
    for name, policy in policies.items():
        spot = [
            c.offer
            for c in evaluate(policy, offers, T0).candidates
            if c.offer.market is Market.SPOT
        ]
        for n in range(per_policy):
            placed.append((name, spot[n % min(len(spot), 40)]))
    launched = T0 - timedelta(hours=3)
    for n, (name, offer) in enumerate(placed):
        job_id = store.jobs.add_job(f"job-{n}", name, {"run": "train", "checkpoint_dir": "/c"})
        key = f"{job_id}-1"
        store.jobs.create_attempt(job_id, 1, key, offer, token_sha256(key), launched)
        store.jobs.update_attempt(
            key,
            instance_id=f"i-{n:05d}",
            state="launched",
            registered_at=launched,
            job_started_at=launched + timedelta(minutes=2),
        )
        store.jobs.transition_job(
            job_id, expected="pending", state="running", reason="running", at=launched
        )
    # the price change: 100 of the jobs' pools, the first 30 over their policy's cap
    now = T0 + timedelta(minutes=2)
    moved: dict[Any, Offer] = {}
    for name, offer in placed:
        if len(moved) == changed:
            break
        if pool_of(offer) in moved:
            continue
        cap = POLICIES[name][1]
        usd = cap * 1.3 if len(moved) < 30 else offer.usd_per_hour * 1.5
        moved[pool_of(offer)] = replace(
            offer, usd_per_hour=usd, observed_at=now - timedelta(seconds=30)
        )
    store.prices.record_offers(list(moved.values()))
    return store, policies, now


def timed(fn: Any, repeat: int) -> tuple[list[float], list[float], Any]:
    """Wall-clock and this process's CPU milliseconds per call, and the last result. The CPU
    time says what the pass costs when the machine is busy with other work (a shared CI
    runner): the wall clock then also counts the time other processes had the CPU."""
    times, cpu, out = [], [], None
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        out = fn()
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - used) * 1000)
    return times, cpu, out


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[max(0, round(0.95 * len(ordered)) - 1)], 2),
        "min_ms": round(ordered[0], 2),
        "max_ms": round(ordered[-1], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--changed", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuopt-replacement-") as tmp:
        started = time.perf_counter()
        store, policies, now = build(Path(tmp), args.jobs, args.changed)
        built_s = time.perf_counter() - started
        live = store.jobs.live_jobs()
        attempts = store.jobs.attempts_of(j.id for j in live)

        def the_pass() -> Any:
            inputs = gather(store, live, attempts, policies, now, overheads=Overheads())
            assert inputs is not None
            return inputs, plan(inputs.jobs, inputs.markets, now)

        pass_times, pass_cpu, (inputs, decided) = timed(the_pass, args.repeat)
        plan_times, plan_cpu, _ = timed(lambda: plan(inputs.jobs, inputs.markets, now), args.repeat)
        load = os.getloadavg()[0]
        offers = len(store.prices.latest_offers())
        store.close()
    reasons: dict[str, int] = {}
    for move in decided.moves:
        reasons[move.reason.value] = reasons.get(move.reason.value, 0) + 1
    held: dict[str, int] = {}
    for h in decided.held:
        held[h.reason.value] = held.get(h.reason.value, 0) + 1
    result = {
        "bench": "replacement",
        "jobs": len(live),
        "running_jobs_gathered": len(inputs.jobs),
        "policies": len(policies),
        "offers": offers,
        "pools_changed": args.changed,
        "repeat": args.repeat,
        "pass": summary(pass_times),
        "pass_cpu": summary(pass_cpu),
        "plan_only": summary(plan_times),
        "plan_only_cpu": summary(plan_cpu),
        "load_average_1m": round(load, 2),
        "target_ms": TARGET_MS,
        "meets_target": statistics.median(pass_times) <= TARGET_MS,
        "moves": reasons,
        "held": held,
        "forced_moves_possible": sum(1 for h in decided.held if h.reason is Reason.BID_CAP)
        + reasons.get(Reason.BID_CAP.value, 0),
        "store": "sqlite (temporary file)",
        "setup_s": round(built_s, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "command": "python -m bench.replacement " + " ".join(argv or sys.argv[1:]),
    }
    print(
        f"the pass (gather + plan) over {result['jobs']} running jobs, {offers} offers, "
        f"{args.changed} pools changed: median {result['pass']['median_ms']} ms, "
        f"p95 {result['pass']['p95_ms']} ms (target {TARGET_MS:g} ms); CPU median "
        f"{result['pass_cpu']['median_ms']} ms; plan alone: median "
        f"{result['plan_only']['median_ms']} ms (CPU {result['plan_only_cpu']['median_ms']} ms); "
        f"load average {load:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"moves: {reasons}; held: {held}")
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
