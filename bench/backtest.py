"""A policy backtest at the issue's scale: 30 days of 10-minute snapshots over 3,000 pools.

Builds `--pools` pools (3,000) from the shared catalog's AWS and GCP rows (their hardware;
zones are numbered past the real ones where the real pools run out), a price every 10 minutes
for `--days` days (30: 12.96 million points) on a seeded random walk around each row's price,
and writes them as Arrow IPC, Parquet and a catalog CSV, the same columns in each. Then,
pinned to one core, times end to end what `gpuopt backtest POLICY --history FILE` does: reading the
history (`optimizer.jobs.history.read_history`) and the replay (`policies.backtest.replay`),
for each file; then the replay with the policy's migration block on (timed apart), and
`advise-bid` on the history read. Times are the process's CPU time (the
target's measure: on a shared machine wall time also counts other processes' turns on the
core), with wall time beside them. Peak memory is the process's peak RSS after the
runs. Prints figures and writes bench/results/backtest.json.

The store case (`gpuopt backtest POLICY --from-store`) puts the same points in a SQLite store
as the daemon's retention leaves them: the last `--store-raw-days` (14, the default
`prices.retention.raw_days`) as raw points, written poll by poll, and every older hour of each
pool as one hourly row (min, median, max: what the retention pass writes, computed here in
numpy: the pass takes about 20 s per day of data on SQLite, docs/costs.md); the last
poll goes through `Prices.record_offers`, which also lists the pools. Then it times opening
the store, reading its history across both tiers and the replay.

    python -m bench.backtest [--pools 3000] [--days 30] [--keep DIR] [--store-raw-days 14]
                             [--skip-store]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from optimizer.jobs.backtest import Migrations
from optimizer.jobs.history import history_table, read_history, write_history
from optimizer.model import Market, Offer
from policies.backtest import History, advise_bid, instant, replay, seconds
from policies.schema import Policy
from policies.table import OfferTable
from providers.skypilot_catalog import read_directory

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "backtest.json"
START = datetime(2026, 3, 1, tzinfo=UTC)
STEP = timedelta(minutes=10)
SEED = 20260301
TARGET_S = 5.0
MIGRATION = {"enabled": True, "min_savings": 0.2, "min_stable": 3600}  # timed apart

POLICY: dict[str, Any] = {
    "apiVersion": "gpuopt/v1",
    "kind": "Policy",
    "name": "bench-backtest",
    "workload": {"gpus": 1, "gpu_memory_gib": 20},
    "markets": ["spot", "on_demand"],
    "rank_by": "price_per_tflop",
    "max_price_age_hours": 1,
    "bid": {"max_usd_per_gpu_hour": 2.5, "max_fraction_of_on_demand": 0.15},
    "placement": {"regions": {"allow": ["us-*", "eu-*", "europe-*"]}},
}


def catalog_dir() -> Path:
    configured = os.environ.get("GPUOPT_SHARED_DIR", "").strip()
    shared = Path(configured) if configured else ROOT.parent / "shared"
    return shared / "data" / "catalog"


def pin_to_one_core() -> str:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except (AttributeError, OSError) as exc:
        return f"not pinned ({exc.__class__.__name__})"
    return f"pinned to core {min(os.sched_getaffinity(0))}"


def build(pools: int, days: int) -> History:
    """Every pool priced at every poll (each poll prices every pool), in poll order."""
    rows = read_directory(catalog_dir(), START)
    order = np.random.default_rng(SEED).permutation(len(rows))  # every kind in a small run
    rows = [rows[i] for i in order]
    picked: list[Offer] = []
    copy = 0
    while len(picked) < pools:
        for offer in rows:
            if len(picked) == pools:
                break
            if copy and offer.market is Market.ON_DEMAND:
                continue  # on-demand prices are per region: one pool each
            zone = offer.zone if copy == 0 else f"{offer.zone or offer.region}-x{copy}"
            picked.append(replace(offer, zone=zone, source="bench"))
        copy += 1
    polls = days * 24 * 6
    rng = np.random.default_rng(SEED)
    base = np.array([o.usd_per_hour for o in picked])
    spot = np.array([o.market is Market.SPOT for o in picked])
    walk = np.cumsum(rng.normal(0, 0.01, (polls, pools)), axis=0)
    prices = np.round(base * np.where(spot, np.exp(walk), 1.0), 6).reshape(-1)
    start = int(START.timestamp())
    times = start + np.arange(polls, dtype=np.int64) * int(STEP.total_seconds())
    return History(
        OfferTable.from_offers(picked),
        np.tile(np.arange(pools, dtype=np.int64), polls),
        np.repeat(times, pools),
        prices,
    )


def build_store(made: History, path: Path, raw_days: float) -> dict[str, Any]:
    """A SQLite store holding `made` as the daemon's retention leaves it (module docstring):
    how many raw points and hourly rows it holds, and its file's size."""
    import sqlite3

    from optimizer.store import Store
    from optimizer.store.history import floor_hour
    from optimizer.store.tables import PriceHistory

    pools = len(made.pools)
    offers = made.pools.offers
    keys = [(o.provider, o.region, o.zone or "", o.instance_type, o.market.value) for o in offers]
    times = made.at.reshape(-1, pools)[:, 0]  # one poll per row of the matrix
    prices = made.usd_per_hour.reshape(-1, pools)
    cutoff = seconds(floor_hour(instant(int(times[-1])) - timedelta(days=raw_days)))
    old = int(np.searchsorted(times, cutoff))  # polls before the first raw hour
    with Store(f"sqlite:///{path}") as store:
        store.create_all()
    as_text = PriceHistory.__table__.c.observed_at.type.bind_processor(  # type: ignore[attr-defined]
        sqlite3_dialect()
    )
    db = sqlite3.connect(path)
    db.execute("PRAGMA cache_size=-1000000")  # 1 GB: the index's hot pages stay in memory
    hourly_rows = 0
    with db:
        # Hourly rows pool by pool, as the retention pass writes them.
        hours = (times[:old] - times[0]) // 3600
        edges = np.flatnonzero(np.diff(hours)) + 1
        starts = np.concatenate([[0], edges])
        spans = np.split(prices[:old], edges)
        low = np.array([p.min(axis=0) for p in spans])
        mid = np.array([np.median(p, axis=0) for p in spans])  # of an even count: the mean
        high = np.array([p.max(axis=0) for p in spans])
        count = np.array([len(p) for p in spans])
        hour_text = [as_text(instant(int(times[i]) // 3600 * 3600)) for i in starts]
        db.executemany(
            "INSERT INTO price_hourly (provider, region, zone, instance_type, market, hour, "
            "min_usd, median_usd, max_usd, points) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                (*keys[p], hour_text[h], low[h, p], mid[h, p], high[h, p], int(count[h]))
                for p in range(pools)
                for h in range(len(starts))
            ),
        )
        hourly_rows = len(starts) * pools
        last = len(times) - 1
        db.executemany(
            "INSERT INTO price_history (provider, region, zone, instance_type, market, "
            "usd_per_hour, observed_at, source) VALUES (?, ?, ?, ?, ?, ?, ?, 'bench')",
            (
                (*keys[p], price, at)
                for k in range(old, last)
                for at in (as_text(instant(int(times[k]))),)
                for p, price in enumerate(prices[k].tolist())
            ),
        )
    db.close()
    with Store(f"sqlite:///{path}") as store:  # the last poll as the daemon records one
        at = instant(int(times[-1]))
        store.prices.record_offers(
            replace(o, usd_per_hour=float(prices[-1, i]), observed_at=at)
            for i, o in enumerate(offers)
        )
    return {
        "raw_days": raw_days,
        "raw_points": (len(times) - old) * pools,
        "hourly_rows": hourly_rows,
        "file_mib": round(path.stat().st_size / 2**20, 1),
    }


def sqlite3_dialect() -> Any:
    from sqlalchemy.dialects import sqlite

    return sqlite.dialect()


def timed(fn: Any) -> tuple[float, Any]:
    """(CPU seconds, result): the process's own time on its one core. This machine's cores
    are shared, and wall time counts the others' turns too; both are recorded."""
    start, wall = time.process_time(), time.perf_counter()
    out = fn()
    WALL.append(time.perf_counter() - wall)
    return time.process_time() - start, out


WALL: list[float] = []


def from_store(policy: Policy, database: Path, stored: dict[str, Any]) -> dict[str, Any]:
    """`gpuopt backtest POLICY --from-store`, timed: open the store, read, replay."""
    from optimizer.jobs.history import store_history
    from optimizer.store import Store

    def read() -> History:
        with Store(f"sqlite:///{database}") as store:
            return store_history(store)

    read_s, history = timed(read)
    replay_s, ran = timed(lambda: replay(policy, history))
    total, wall = read_s + replay_s, WALL[-2] + WALL[-1]
    print(
        f"from the store (SQLite, {stored['raw_points']:,} raw points and "
        f"{stored['hourly_rows']:,} hourly rows): read {read_s:.2f} s + replay {replay_s:.2f} s"
        f" = {total:.2f} s CPU ({wall:.2f} s wall)"
    )
    return {
        "engine": "sqlite",
        **stored,
        "points_read": len(history.at),
        "read_cpu_s": round(read_s, 2),
        "read_wall_s": round(WALL[-2], 2),
        "replay_cpu_s": round(replay_s, 2),
        "end_to_end_cpu_s": round(total, 2),
        "end_to_end_wall_s": round(wall, 2),
        "within_target": total <= TARGET_S,
        "backtest": ran.to_dict(series=False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, default=3000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--keep", type=Path, help="write the files here and keep them")
    parser.add_argument("--store-raw-days", type=float, default=14.0)
    parser.add_argument("--skip-store", action="store_true", help="leave the store case out")
    args = parser.parse_args()

    policy = Policy.model_validate(POLICY)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="gpuopt-backtest-"))
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "arrow": folder / "history.arrow",
        "parquet": folder / "history.parquet",
        "csv": folder / "history.csv",
    }
    built_s, made = timed(lambda: build(args.pools, args.days))
    for name, file in files.items():
        if file.exists():
            continue
        if name == "csv":  # Arrow's writer: the catalog's columns, ISO times (Python's is slow)
            pcsv.write_csv(history_table(made), file)
        else:
            write_history(made, file)
    points = len(made.at)
    database = folder / "gpuopt.db"
    stored: dict[str, Any] = {}
    if not args.skip_store:
        if database.exists():
            database.unlink()
        store_s, stored = timed(lambda m=made: build_store(m, database, args.store_raw_days))
        stored["build_cpu_s"] = round(store_s, 1)
    del made
    pinning = pin_to_one_core()

    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyarrow": pa.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "affinity": pinning,
        "pools": args.pools,
        "days": args.days,
        "points": points,
        "build_data_s": round(built_s, 2),
        "file_mib": {name: round(f.stat().st_size / 2**20, 1) for name, f in files.items()},
        "target_s": TARGET_S,
    }
    for name, file in files.items():
        read_s, history = timed(lambda file=file: read_history(file))
        replay_s, ran = timed(lambda history=history: replay(policy, history))
        total = read_s + replay_s
        wall = WALL[-2] + WALL[-1]
        result[name] = {
            "read_cpu_s": round(read_s, 2),
            "replay_cpu_s": round(replay_s, 2),
            "end_to_end_cpu_s": round(total, 2),
            "end_to_end_wall_s": round(wall, 2),
            "within_target": total <= TARGET_S,
            "backtest": ran.to_dict(series=False),
        }
        print(
            f"{name}: read {read_s:.2f} s + replay {replay_s:.2f} s = {total:.2f} s CPU "
            f"({wall:.2f} s wall)"
        )
    if not args.skip_store:
        result["from_store"] = from_store(policy, database, stored)
    history = read_history(files["arrow"])
    migrating = policy.model_copy(update={"migration": policy.migration.model_validate(MIGRATION)})
    moved_s, moved = timed(lambda: replay(migrating, history, mover=Migrations(migrating, history)))
    result["with_migration"] = {
        "migration": MIGRATION,
        "replay_cpu_s": round(moved_s, 2),
        "backtest": moved.to_dict(series=False),
    }
    print(f"replay with migration on: {moved_s:.2f} s CPU, {moved.migrations} migrations")
    advise_s, advice = timed(lambda: advise_bid(policy, history, 0.95))
    result["advise_bid_cpu_s"] = round(advise_s, 2)
    result["advise_bid"] = advice.to_dict()
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(f"{points:,} points, {args.pools:,} pools, {pinning}; advise-bid {advise_s:.2f} s")
    print(f"backtest: {json.dumps(result['arrow']['backtest'])}")
    print(f"peak RSS {result['peak_rss_mib']} MiB; load average {result['load_average_1m']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    if args.keep is None:
        for file in [*files.values(), database]:
            file.unlink(missing_ok=True)
        for leftover in folder.glob("gpuopt.db-*"):  # SQLite's WAL and shared memory
            leftover.unlink()
        folder.rmdir()


if __name__ == "__main__":
    main()
