"""A policy backtest at the issue's scale: 30 days of 10-minute snapshots over 3,000 pools.

Builds `--pools` pools (3,000) from the shared catalog's AWS and GCP rows (their hardware;
zones are numbered past the real ones where the real pools run out), a price every 10 minutes
for `--days` days (30: 12.96 million points) on a seeded random walk around each row's price,
and writes them as a catalog CSV and as Parquet with the same columns. Then, pinned to one
core, times end to end what `gpuopt backtest POLICY --history FILE` does: reading the history
(`optimizer.jobs.history.read_history`) and the replay (`policies.backtest.replay`), for each
file, and `advise-bid` on the history read. Peak memory is the process's peak RSS after the
runs. Prints figures and writes bench/results/backtest.json.

    python -m bench.backtest [--pools 3000] [--days 30] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from optimizer.jobs.history import read_history
from optimizer.model import Market
from policies.backtest import advise_bid, replay
from policies.schema import Policy
from providers.skypilot_catalog import read_directory

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "backtest.json"
START = datetime(2026, 3, 1, tzinfo=UTC)
STEP = timedelta(minutes=10)
SEED = 20260301
TARGET_S = 5.0

POLICY: dict[str, Any] = {
    "apiVersion": "gpuopt/v1",
    "kind": "Policy",
    "name": "bench-backtest",
    "workload": {"gpus": 1, "gpu_memory_gib": 20},
    "markets": ["spot", "on_demand"],
    "rank_by": "price_per_tflop",
    "max_price_age_hours": 1,
    "bid": {"max_usd_per_gpu_hour": 2.5, "max_fraction_of_on_demand": 0.6},
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


def build(pools: int, days: int) -> pa.Table:
    """Every point as a catalog row, in poll order (each poll prices every pool)."""
    rows = read_directory(catalog_dir(), START)
    order = np.random.default_rng(SEED).permutation(len(rows))  # every kind in a small run
    rows = [rows[i] for i in order]
    picked = []
    copy = 0
    while len(picked) < pools:
        for offer in rows:
            if len(picked) == pools:
                break
            zone = offer.zone if copy == 0 else f"{offer.zone or offer.region}-x{copy}"
            if offer.market is Market.ON_DEMAND and copy:
                continue  # on-demand prices are per region: one pool each
            picked.append((offer, zone))
        copy += 1
    polls = days * 24 * 6
    rng = np.random.default_rng(SEED)
    base = np.array([o.usd_per_hour for o, _ in picked])
    spot = np.array([o.market is Market.SPOT for o, _ in picked])
    walk = np.cumsum(rng.normal(0, 0.01, (polls, pools)), axis=0)
    prices = np.round(base * np.where(spot, np.exp(walk), 1.0), 6).reshape(-1)
    times = START.timestamp() + np.arange(polls) * STEP.total_seconds()

    def column(values: list[Any]) -> pa.Array:
        return pa.DictionaryArray.from_arrays(
            pa.array(np.tile(np.arange(pools, dtype=np.int32), polls)), pa.array(values)
        ).dictionary_decode()

    offers = [o for o, _ in picked]
    table = {
        "provider": column([o.provider for o in offers]),
        "region": column([o.region for o in offers]),
        "zone": column([z or "" for _, z in picked]),
        "instance_type": column([o.instance_type for o in offers]),
        "gpu_model": column([o.gpu_model for o in offers]),
        "gpu_count": column([o.gpu_count for o in offers]),
        "gpu_memory_gib": column([o.gpu_memory_gib for o in offers]),
        "vcpus": column([o.vcpus for o in offers]),
        "ram_gib": column([o.ram_gib for o in offers]),
        "interconnect": column([o.interconnect.value for o in offers]),
        "market": column([o.market.value for o in offers]),
        "usd_per_hour": pa.array(prices),
        "observed_at": pa.array(np.repeat(times, pools).astype("int64"), pa.int64()).cast(
            pa.timestamp("s", tz="UTC")
        ),
        "source": column(["bench" for _ in offers]),
    }
    return pa.table(table)


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, default=3000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--keep", type=Path, help="write the files here and keep them")
    args = parser.parse_args()

    policy = Policy.model_validate(POLICY)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="gpuopt-backtest-"))
    folder.mkdir(parents=True, exist_ok=True)
    csv_file, parquet_file = folder / "history.csv", folder / "history.parquet"
    built_s, table = timed(lambda: build(args.pools, args.days))
    if not csv_file.exists():
        pcsv.write_csv(table, csv_file)
    if not parquet_file.exists():
        pq.write_table(table, parquet_file)
    points = table.num_rows
    del table
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
        "csv_mib": round(csv_file.stat().st_size / 2**20, 1),
        "parquet_mib": round(parquet_file.stat().st_size / 2**20, 1),
        "target_s": TARGET_S,
    }
    for name, file in (("parquet", parquet_file), ("csv", csv_file)):
        read_s, history = timed(lambda file=file: read_history(file))
        replay_s, ran = timed(lambda history=history: replay(policy, history))
        total = read_s + replay_s
        result[name] = {
            "read_s": round(read_s, 2),
            "replay_s": round(replay_s, 2),
            "end_to_end_s": round(total, 2),
            "within_target": total <= TARGET_S,
            "backtest": ran.to_dict(series=False),
        }
        print(f"{name}: read {read_s:.2f} s + replay {replay_s:.2f} s = {total:.2f} s")
    advise_s, advice = timed(lambda: advise_bid(policy, history, 0.95))
    result["advise_bid_s"] = round(advise_s, 2)
    result["advise_bid"] = advice.to_dict()
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(f"{points:,} points, {args.pools:,} pools, {pinning}; advise-bid {advise_s:.2f} s")
    print(f"backtest: {json.dumps(result['csv']['backtest'])}")
    print(f"peak RSS {result['peak_rss_mib']} MiB; load average {result['load_average_1m']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    if args.keep is None:
        for file in (csv_file, parquet_file):
            file.unlink()
        folder.rmdir()


if __name__ == "__main__":
    main()
