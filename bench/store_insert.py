"""How fast `store.prices.record_offers` lands price rows, on SQLite and (optionally) PostgreSQL.

Builds synthetic offers shaped like real polls (AWS/GCP GPU types, zonal spot, regional
on-demand, spot prices drifting every five minutes), then times two ways of writing them:
all rows in one `record_offers` call, and one call per poll snapshot (what the daemon does).
Each run gets a fresh SQLite file in a temp dir, or a throwaway PostgreSQL schema dropped
afterwards. Prints figures and writes them to bench/results/store_insert.json.

    python bench/store_insert.py [--rows 100000] [--database-url postgresql://…]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from itertools import groupby
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import create_engine, func, select, text

from optimizer.model import Market, Offer
from optimizer.store import Store, is_sqlite_url, normalize_database_url
from optimizer.store.tables import LatestPrice, PriceHistory
from providers.snapshot import load_snapshot

RESULTS = Path(__file__).resolve().parent / "results" / "store_insert.json"
POLL_EVERY = timedelta(minutes=5)
START = datetime(2025, 6, 1, tzinfo=UTC)

# Synthetic spot zones per region: the zone names only need to be distinct pool keys.
SPOT_ZONES_PER_REGION = 3


def _pools() -> list[dict[str, Any]]:
    """Every (provider, region, zone, type, market) a poll would report, with its shape.

    Shapes and on-demand prices come from the bundled list-price snapshot; AWS prices spot
    per zone, GCP per region (zone None).
    """
    pools: list[dict[str, Any]] = []
    for offer in load_snapshot():
        shape = {
            name: getattr(offer, name)
            for name in (
                "provider",
                "region",
                "instance_type",
                "gpu_model",
                "gpu_count",
                "gpu_memory_gib",
                "vcpus",
                "ram_gib",
                "interconnect",
            )
        }
        shape["on_demand"] = offer.usd_per_hour
        pools.append({**shape, "zone": None, "market": Market.ON_DEMAND})
        spot_zones: list[str | None] = (
            [f"{offer.region}-z{n}" for n in range(1, SPOT_ZONES_PER_REGION + 1)]
            if offer.provider == "aws"
            else [None]
        )
        pools.extend({**shape, "zone": z, "market": Market.SPOT} for z in spot_zones)
    return pools


def build_offers(rows: int, seed: int = 7) -> list[Offer]:
    """`rows` offers: every pool once per five-minute poll, spot prices on a bounded walk."""
    rng = random.Random(seed)
    pools = _pools()
    ratio = [rng.uniform(0.3, 0.7) for _ in pools]  # spot / on-demand, per pool
    offers: list[Offer] = []
    poll = 0
    while len(offers) < rows:
        at = START + poll * POLL_EVERY
        for i, pool in enumerate(pools):
            if len(offers) == rows:
                break
            on_demand = pool["on_demand"]
            spot = pool["market"] is Market.SPOT
            if spot:
                ratio[i] = min(0.9, max(0.2, ratio[i] + rng.gauss(0, 0.01)))
            offers.append(
                Offer(
                    provider=pool["provider"],
                    region=pool["region"],
                    zone=pool["zone"],
                    instance_type=pool["instance_type"],
                    gpu_model=pool["gpu_model"],
                    gpu_count=pool["gpu_count"],
                    gpu_memory_gib=pool["gpu_memory_gib"],
                    vcpus=pool["vcpus"],
                    ram_gib=pool["ram_gib"],
                    interconnect=pool["interconnect"],
                    market=pool["market"],
                    usd_per_hour=round(on_demand * ratio[i], 4) if spot else on_demand,
                    observed_at=at,
                    placement_score=float(rng.randint(1, 10)) if spot else None,
                    interruption_bucket=rng.choice(["<5%", "5-10%", "10-15%"]) if spot else None,
                    source="simulated",
                )
            )
        poll += 1
    return offers


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@contextmanager
def sqlite_store() -> Iterator[Store]:
    with (
        tempfile.TemporaryDirectory(prefix="gpuopt-bench-") as tmp,
        Store(f"sqlite:///{Path(tmp) / 'gpuopt.db'}") as store,
    ):
        store.create_all()
        yield store


def postgres_store_factory(url: str) -> Callable[[], Any]:
    @contextmanager
    def postgres_store() -> Iterator[Store]:
        schema = f"gpuopt_bench_{uuid.uuid4().hex}"
        admin = create_engine(url)
        try:
            with admin.begin() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            with Store(url, schema=schema) as store:
                store.create_all()
                yield store
        finally:
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            admin.dispose()

    return postgres_store


def _count(store: Store, table: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def run_mode(
    engine: str, make_store: Callable[[], Any], offers: Sequence[Offer], mode: str
) -> dict[str, Any]:
    batches = (
        [list(offers)]
        if mode == "one call"
        else [list(group) for _, group in groupby(offers, key=lambda o: o.observed_at)]
    )
    with make_store() as store:
        started = time.perf_counter()
        written = sum(store.prices.record_offers(batch) for batch in batches)
        seconds = time.perf_counter() - started
        history_rows = _count(store, PriceHistory)
        latest_rows = _count(store, LatestPrice)
        started = time.perf_counter()
        latest = store.prices.latest_offers()
        read_seconds = time.perf_counter() - started
    if written != len(offers) or history_rows != len(offers) or latest_rows != len(latest):
        raise SystemExit(f"{engine}/{mode}: rows went missing ({written=}, {history_rows=})")
    result = {
        "engine": engine,
        "mode": mode,
        "calls": len(batches),
        "rows": written,
        "seconds": round(seconds, 4),
        "rows_per_s": round(written / seconds),
        "latest_rows": latest_rows,
        "latest_offers_read_seconds": round(read_seconds, 4),
    }
    print(
        f"{engine:<10} {mode:<13} {written:>8,} rows in {seconds:7.3f} s "
        f"= {written / seconds:>10,.0f} rows/s  ({len(batches)} call(s); "
        f"read {latest_rows} latest in {read_seconds * 1000:.1f} ms)"
    )
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("GPUOPT_DATABASE_URL", "").strip() or None,
        help="PostgreSQL URL to bench as well (default: $GPUOPT_DATABASE_URL)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    offers = build_offers(args.rows)
    build_seconds = time.perf_counter() - started
    rss_after_build = _peak_rss_mib()
    pools = len({offer.pool for offer in offers})
    print(f"built {len(offers):,} offers over {pools} pools in {build_seconds:.2f} s")

    engines: list[tuple[str, Callable[[], Any]]] = [("sqlite", sqlite_store)]
    if args.database_url:
        url = normalize_database_url(args.database_url, origin="--database-url")
        if is_sqlite_url(url):
            print("--database-url is SQLite; the temp-file SQLite run already covers it")
        else:
            engines.append(("postgresql", postgres_store_factory(url)))

    results = [
        run_mode(name, make_store, offers, mode)
        for name, make_store in engines
        for mode in ("one call", "per poll")
    ]
    peak = _peak_rss_mib()
    print(f"peak RSS {peak:.0f} MiB ({rss_after_build:.0f} MiB after building the offers)")

    report = {
        "bench": "store_insert",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "arch": platform.machine(),
        },
        "sqlalchemy": sqlalchemy.__version__,
        "sqlite": sqlite3.sqlite_version,
        "rows": len(offers),
        "pools": pools,
        "build_seconds": round(build_seconds, 3),
        "peak_rss_mib": round(peak, 1),
        "peak_rss_mib_after_build": round(rss_after_build, 1),
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
