"""The cost ledger at scale: `gpuopt costs --by month`, the store's size, the pruning loop.

Builds `--pools` spot pools (3,000) with a price every 10 minutes for `--days` days (30:
12.96 million raw points, written in poll order as bench/prices_retention.py does, whose
generator and engines this bench shares), each (provider, region, type)'s on-demand list
price, and `--attempts` attempts (10,000: 2,000 jobs of 5) on random pools, each billed 1 to
72 hours inside the window; 1% are still running at the end, the rest ended (a fifth of them
interrupted by the cloud) and are frozen as the daemon's reconcile passes freeze them (500 a
pass). Then, with "now" at the end of the data (and, on PostgreSQL, after a `VACUUM ANALYZE` of
the tables the bulk load or the pruning changed, as autovacuum would soon do):

- `gpuopt costs --by month`, the CLI's own path end to end: a real API server over the store
  on loopback, the command run as a process (`python -m optimizer.cli costs --by month`;
  its wall time, which includes starting Python and importing the CLI, beside that of
  `gpuopt costs --help`, which pays only those; one request gives the table and its spot
  savings line),
  the `GET /costs?by=month` it sends (timed from an HTTP client), and the ledger call behind
  it (`Ledger.groups(GroupBy.MONTH)`) in process. Target: <= 1 s;
- the same with `--by job` (every line built) and the cumulative counters' read (a /metrics
  scrape's work);
- the pruning loop's first pass at the end of the data (`RetentionLoop.run_once`): every
  point older than the 14-day raw retention becomes hourly rows, per day of data; and the
  next day's pass;
- the store's size on disk before and after downsampling, and after compaction;
- `gpuopt costs --by month` again after downsampling (the live attempts now read both tiers);
- the query plan of every statement `Ledger.groups(MONTH)` sends.

Each engine gets a fresh SQLite file in a temp dir, or a throwaway PostgreSQL schema dropped
afterwards (`--database-url`, default $GPUOPT_TEST_DATABASE_URL). Prints the figures and
writes bench/results/ledger.json.

    python bench/ledger.py [--pools 3000] [--days 30] [--attempts 10000]
        [--database-url postgresql://…] [--skip-sqlite] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    # Run as a file (`python bench/ledger.py`): it shares bench.prices_retention and the
    # tests' helpers, packages of the repository root, so run this file as the module
    # bench.ledger from there, where `python -m` finds them.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.ledger", *sys.argv[1:]])

import httpx  # noqa: E402
import sqlalchemy  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from bench.prices_retention import (  # noqa: E402
    START,
    Engine,
    compact_timed,
    count,
    data_options,
    engines,
    first_pass,
    load_timed,
    make_pools,
    parse_data_options,
    print_sizes,
    report_head,
    timed_pass,
    write_report,
)
from optimizer.alerts.outbox import Emitter  # noqa: E402
from optimizer.alerts.routing import Router  # noqa: E402
from optimizer.api.app import create_app  # noqa: E402
from optimizer.api.state import ApiState  # noqa: E402
from optimizer.clock import ManualClock  # noqa: E402
from optimizer.costs import GroupBy  # noqa: E402
from optimizer.daemon.metrics import Metrics  # noqa: E402
from optimizer.daemon.policies import PolicyRegistry  # noqa: E402
from optimizer.daemon.server import ApiServer  # noqa: E402
from optimizer.jobs.counters import cumulative  # noqa: E402
from optimizer.jobs.ledger import Ledger  # noqa: E402
from optimizer.model import Market  # noqa: E402
from optimizer.store import Store  # noqa: E402
from optimizer.store.engine import table  # noqa: E402
from optimizer.store.tables import Attempt, CostLine, Job, PriceHistory  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ledger.json"
SEED = 20260316
TOKEN = "bench-ledger-token-0123456789abcdef"
ATTEMPTS_PER_JOB = 5
LIVE_FRACTION = 0.01
CLOUD_ENDED_FRACTION = 0.2
TARGET_S = 1.0


# -- data ---------------------------------------------------------------------------------------


def on_demand_rows(pools: Sequence[tuple[str, ...]], rng: random.Random) -> list[dict[str, Any]]:
    """One on-demand list price per (provider, region, instance type), zone-less, observed at
    the start (the series the ledger's baseline falls back to)."""
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for provider, region, _zone, instance_type, _market in pools:
        key = (provider, region, instance_type)
        if key not in seen:
            seen[key] = {
                "provider": provider,
                "region": region,
                "zone": "",
                "instance_type": instance_type,
                "market": Market.ON_DEMAND.value,
                "usd_per_hour": round(rng.uniform(40.0, 60.0), 4),
                "observed_at": START,
                "source": "bench",
            }
    return list(seen.values())


def attempt_rows(
    pools: Sequence[tuple[str, ...]], count: int, end: datetime, rng: random.Random
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(jobs, attempts): `count` attempts, ATTEMPTS_PER_JOB per job, on random pools."""
    jobs, attempts = [], []
    span = (end - START).total_seconds()
    for n in range(count):
        job_id, number = n // ATTEMPTS_PER_JOB + 1, n % ATTEMPTS_PER_JOB + 1
        if number == 1:
            jobs.append(
                {
                    "id": job_id,
                    "name": f"job-{job_id:05d}",
                    "policy": f"team-{job_id % 7}",
                    "spec": "{}",
                    "state": "succeeded",
                    "restarts": 0,
                    "created_at": START,
                    "updated_at": START,
                }
            )
        provider, region, zone, instance_type, market = rng.choice(pools)
        hours = rng.uniform(1, 72)
        live = rng.random() < LIVE_FRACTION
        if live:
            launched = end - timedelta(hours=rng.uniform(1, 72))
        else:
            launched = START + timedelta(seconds=rng.uniform(0, span - hours * 3600))
        ended = None if live else launched + timedelta(hours=hours)
        by_cloud = not live and rng.random() < CLOUD_ENDED_FRACTION
        attempts.append(
            {
                "job_id": job_id,
                "number": number,
                "idempotency_key": f"{job_id}-{number}",
                "provider": provider,
                "region": region,
                "zone": zone,
                "instance_type": instance_type,
                "market": market,
                "usd_per_hour": round(rng.uniform(0.5, 30.0), 4),
                "instance_id": f"i-{n:08x}",
                "state": "running" if live else "ended",
                "started_at": launched - timedelta(minutes=1),
                "ended_at": ended,
                "token_sha256": "",
                "job_started_at": launched + timedelta(minutes=3),
                "instance_gone": not live,
                "preempted": by_cloud,
                "launched_at": launched,
                "terminated_at": ended,
                "terminated_by": None if live else ("cloud" if by_cloud else "gpuopt"),
                "disk_gib": 100.0,
            }
        )
    return jobs, attempts


def load_ledger(
    store: Store, pools: Sequence[tuple[str, ...]], attempts: int, end: datetime
) -> dict[str, Any]:
    rng = random.Random(SEED)
    on_demand = on_demand_rows(pools, rng)
    jobs, rows = attempt_rows(pools, attempts, end, rng)
    started = time.perf_counter()
    with store.engine.begin() as conn:
        conn.execute(insert(table(PriceHistory)), on_demand)
        conn.execute(insert(table(Job)), jobs)
        for first in range(0, len(rows), 2000):
            conn.execute(insert(table(Attempt)), rows[first : first + 2000])
    if store.engine.dialect.name == "postgresql":
        with store.engine.begin() as conn:  # the ids given, the sequence moves past them
            conn.exec_driver_sql("SELECT setval('job_id_seq', (SELECT max(id) FROM job))")
            conn.exec_driver_sql("ANALYZE")
    return {
        "on_demand_series": len(on_demand),
        "jobs": len(jobs),
        "attempts": len(rows),
        "live_attempts": sum(r["ended_at"] is None for r in rows),
        "seconds": round(time.perf_counter() - started, 2),
    }


def freeze_all(store: Store, now: datetime) -> dict[str, Any]:
    """Freeze every ended attempt the way the reconcile passes do: 500 a pass."""
    ledger = Ledger(store)
    passes, lines, seconds = 0, 0, []
    while True:
        started = time.perf_counter()
        written = ledger.freeze(now)
        seconds.append(time.perf_counter() - started)
        if not written:
            break
        passes += 1
        lines += written
    return {
        "passes": passes,
        "lines": lines,
        "seconds": round(sum(seconds), 2),
        "per_pass_median_s": round(statistics.median(seconds[:-1] or seconds), 3),
    }


# -- measuring ----------------------------------------------------------------------------------


def timings(fn: Callable[[], object], runs: int) -> dict[str, float]:
    fn()  # warm-up
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return {
        "median_s": round(statistics.median(seconds), 3),
        "min_s": round(min(seconds), 3),
        "max_s": round(max(seconds), 3),
    }


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    env.update(GPUOPT_API_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args, *(["--api", url] if url else [])],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def costs_by_month(store: Store, now: datetime, runs: int) -> dict[str, Any]:
    """`gpuopt costs --by month` end to end, its request, and the ledger call behind it."""
    state = ApiState(
        store=store,
        policies=PolicyRegistry(),
        emitter=Emitter(store.events, Router([], [])),
        metrics=Metrics(),
        clock=ManualClock(now),
        token=SecretStr(TOKEN),
    )
    server = ApiServer("127.0.0.1", 0)
    server.start(create_app(state))
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=300) as client:
            answer = client.get("/costs", params={"by": "month"})
            answer.raise_for_status()
            months = [g["group"] for g in answer.json()]
            request = timings(lambda: client.get("/costs", params={"by": "month"}), runs)
            by_job = timings(lambda: client.get("/costs", params={"by": "job"}), max(runs // 2, 1))
        ledger = Ledger(store, ManualClock(now))
        in_process = timings(lambda: ledger.groups(GroupBy.MONTH), runs)
        command: list[float] = []
        for _ in range(runs):
            started = time.perf_counter()
            done = cli(server.url, "costs", "--by", "month")
            command.append(time.perf_counter() - started)
            if done.returncode != 0:
                raise SystemExit(f"gpuopt costs failed: {done.stderr.strip()}")
        table = done.stdout
    finally:
        server.stop()
    scrape = timings(lambda: cumulative(store, now), runs)
    return {
        "months": months,
        "cli_wall_s": {
            "median_s": round(statistics.median(command), 3),
            "min_s": round(min(command), 3),
            "max_s": round(max(command), 3),
        },
        "get_costs_by_month": request,
        "ledger_groups_by_month": in_process,
        "get_costs_by_job": by_job,
        "metrics_counters_read": scrape,
        "table_rows": sum(1 for row in table.splitlines() if row.startswith("│")),
    }


def plans(engine: Engine, now: datetime) -> dict[str, list[str]]:
    """The query plan of each statement one `Ledger.groups(MONTH)` sends (the first of each
    kind, with its parameters), as the database explains it."""
    sent: dict[str, Any] = {}

    def capture(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        sent.setdefault(statement, params)

    sqlalchemy.event.listen(engine.store.engine, "before_cursor_execute", capture)
    try:
        Ledger(engine.store, ManualClock(now)).groups(GroupBy.MONTH)
    finally:
        sqlalchemy.event.remove(engine.store.engine, "before_cursor_execute", capture)
    out = {}
    for statement, params in sent.items():
        name = " ".join(statement.split())[:120]
        out[name] = [line.strip() for line in engine.plan(statement, params) if line.strip()]
    return out


def print_costs(name: str, label: str, figures: dict[str, Any]) -> None:
    print(
        f"{name:<10} gpuopt costs --by month {label}: command {figures['cli_wall_s']['median_s']} s"
        f" (median of its runs), GET /costs?by=month {figures['get_costs_by_month']['median_s']}"
        f" s, Ledger.groups {figures['ledger_groups_by_month']['median_s']} s; --by job "
        f"{figures['get_costs_by_job']['median_s']} s; counters' read "
        f"{figures['metrics_counters_read']['median_s']} s"
    )


def run(make: Callable[[], Any], pools: Sequence[tuple[str, ...]], args: argparse.Namespace) -> Any:
    end = START + timedelta(days=args.days)
    engine: Engine
    with make() as engine:
        store, name = engine.store, engine.name
        points, load_s = load_timed(engine, pools, args.days)
        loaded = load_ledger(store, pools, args.attempts, end)
        print(
            f"{name:<10} {loaded['attempts']:,} attempts of {loaded['jobs']:,} jobs "
            f"({loaded['live_attempts']} live) in {loaded['seconds']} s"
        )
        frozen = freeze_all(store, end)
        print(
            f"{name:<10} froze {frozen['lines']:,} lines in {frozen['passes']} passes of 500 "
            f"attempts: {frozen['seconds']} s (median pass {frozen['per_pass_median_s']} s)"
        )
        engine.settle()
        before = costs_by_month(store, end, args.runs)
        print_costs(name, "(raw points)", before)
        before["plans"] = plans(engine, end)
        for statement, plan in before["plans"].items():
            print(f"{name:<10}   plan of {statement[:60]}…: {' | '.join(plan)[:300]}")
        size_before = engine.sizes()
        print_sizes(name, "before", size_before)

        first = first_pass(store, end, args)
        print(
            f"{name:<10} pruning, first pass: {first['summarized']:,} points "
            f"({first['days_of_data']} days) in "
            f"{first['seconds']} s = {first['seconds_per_day_of_data']} s per day of data "
            f"({first['batches']} batches, longest {first['longest_batch_seconds']} s)"
        )
        next_day = timed_pass(store, end + timedelta(days=1), args.batch_rows)
        print(
            f"{name:<10} pruning, the next day's pass: {next_day['summarized']:,} points in "
            f"{next_day['seconds']} s"
        )
        size_after = engine.sizes()
        print_sizes(name, "after", size_after)
        engine.settle()
        after = costs_by_month(store, end + timedelta(days=1), args.runs)
        print_costs(name, "(downsampled)", after)
        raw_left, lines = count(store, PriceHistory), count(store, CostLine)
        compacted, compact_s = compact_timed(engine)
        met = all(
            figures[key]["median_s"] <= TARGET_S
            for figures in (before, after)
            for key in ("cli_wall_s", "get_costs_by_month")
        )
        return {
            "engine": name,
            "raw_points_loaded": points,
            "load_seconds": round(load_s, 1),
            "ledger_data": loaded,
            "freeze": frozen,
            "costs_by_month_raw": before,
            "costs_by_month_downsampled": after,
            "target_1s_met": met,
            "prune_first_pass": first,
            "prune_next_day_pass": next_day,
            "raw_points_left": raw_left,
            "cost_lines": lines,
            "size_before": size_before,
            "size_after_pruning": size_after,
            "size_after_compaction": compacted,
            "compaction_seconds": round(compact_s, 1),
        }


def main(argv: Sequence[str] | None = None) -> None:
    parser = data_options((__doc__ or "").splitlines()[0], RESULTS)
    parser.add_argument("--runs", type=int, default=5)
    args = parse_data_options(parser, argv)
    pools = make_pools(args.pools)
    print(
        f"{len(pools):,} pools x {args.days} days of 10-minute points = "
        f"{len(pools) * args.days * 144:,} rows; {args.attempts:,} attempts"
    )
    startups = []
    for _ in range(args.runs):
        started = time.perf_counter()
        shown = cli("", "costs", "--help")
        startups.append(time.perf_counter() - started)
        if shown.returncode != 0:
            raise SystemExit(f"gpuopt costs --help failed: {shown.stderr.strip()}")
    startup = round(statistics.median(startups), 3)
    print(f"gpuopt costs --help (Python's start and the command's imports): {startup} s median")
    results = [run(make, pools, args) for make in engines(args)]
    command = (
        f"python bench/ledger.py --pools {args.pools} --days {args.days} "
        f"--attempts {args.attempts} --runs {args.runs}"
    )
    report = report_head("ledger", command, args, len(pools))
    report.update(
        raw_points=len(pools) * args.days * 144,
        target_s=TARGET_S,
        gpuopt_costs_help_wall_s=startup,
        results=results,
    )
    write_report(report, args.output)


if __name__ == "__main__":
    main()
