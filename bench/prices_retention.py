"""Price history retention at scale: the pruning pass, the store's size, the ledger's reads.

Builds `--pools` pools (3,000 by default) with a spot price every 10 minutes for `--days`
days (30: 12.96 million raw points), written in poll order (each 10-minute poll writes every
pool, as the daemon does), then:

- the first retention pass at the end of the data (`RetentionLoop.run_once`, the daemon's
  own loop, `--batch-rows` per batch, 5,000 as in the daemon): every point older than 14
  days becomes hourly rows. Reported per day of data summarized, with the longest batch
  (how long one transaction holds SQLite's write lock);
- the steady state: the clock moves one day on and a pass summarizes that day; then one
  hour on, as the daemon's hourly pass does; and a pass with nothing to do;
- the store's size on disk before and after: SQLite's file and the bytes its pages in use
  hold (deleted rows leave free pages the file keeps until VACUUM), then after VACUUM;
  PostgreSQL's `pg_total_relation_size` of the two tables, and after VACUUM FULL;
- the ledger's reads: `store.prices.price_history(..., prior=True)` for 10,000 attempts
  (random pool, a random 1-72 h window in the 30 days), before and after downsampling, and
  the query plan, which must search the (pool, time) indexes.

The raw rows are loaded with the history index dropped and built afterwards (an index built
in one go is more compact than one grown poll by poll, so the "before" size is a little
optimistic). Each engine gets a fresh SQLite file in a temp dir, or a throwaway PostgreSQL
schema dropped afterwards. Prints figures and writes bench/results/prices_retention.json.

    python bench/prices_retention.py [--pools 3000] [--days 30] [--attempts 10000]
        [--database-url postgresql://…] [--skip-sqlite]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import create_engine, func, select, text
from sqlmodel import SQLModel

from optimizer.clock import ManualClock
from optimizer.daemon.loops.retention import RetentionLoop
from optimizer.store import PruneBatch, Retention, Store, is_sqlite_url, normalize_database_url
from optimizer.store.engine import table
from optimizer.store.tables import PriceHistory, PriceHourly

RESULTS = Path(__file__).resolve().parent / "results" / "prices_retention.json"
START = datetime(2026, 1, 1, tzinfo=UTC)
STEP = timedelta(minutes=10)
RETENTION = Retention(raw=timedelta(days=14), hourly=timedelta(days=400))
SEED = 20260301
POLLS_PER_CHUNK = 100  # polls per executemany / COPY chunk
HISTORY_INDEX = "ix_price_history_pool_time"
COLUMNS = ("provider", "region", "zone", "instance_type", "market", "usd_per_hour", "observed_at")


def make_pools(count: int) -> list[tuple[str, str, str, str, str]]:
    """`count` spot pools with names shaped like real ones (AWS zone IDs, GCP zones)."""
    aws_types = [
        f"{f}.{s}xlarge" for f in ("p4d", "p5", "g5", "g6", "p3") for s in (2, 4, 8, 12, 24, 48)
    ]
    gcp_types = [f"a{g}-highgpu-{n}g" for g in (2, 3) for n in (1, 2, 4, 8)] + [
        f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)
    ]
    pools: list[tuple[str, str, str, str, str]] = []
    region = 0
    while len(pools) < count:
        aws_region, gcp_region = f"us-region-{region}", f"europe-west{region}"
        for zone in range(1, 4):
            for instance_type in aws_types:
                pools.append(("aws", aws_region, f"usr{region}-az{zone}", instance_type, "spot"))
            for instance_type in gcp_types:
                pools.append(
                    ("gcp", gcp_region, f"{gcp_region}-{'abc'[zone - 1]}", instance_type, "spot")
                )
        region += 1
    return pools[:count]


def polls(
    pools: Sequence[tuple[str, ...]], days: int, rng: random.Random
) -> Iterator[list[tuple[Any, ...]]]:
    """Chunks of rows in poll order: every pool once per 10-minute poll, prices on a walk."""
    price = [rng.uniform(0.5, 30.0) for _ in pools]
    steps = days * 144
    for first in range(0, steps, POLLS_PER_CHUNK):
        rows: list[tuple[Any, ...]] = []
        for step in range(first, min(steps, first + POLLS_PER_CHUNK)):
            at = START + step * STEP
            for i, pool in enumerate(pools):
                price[i] = max(0.05, price[i] * (1 + rng.gauss(0, 0.01)))
                rows.append((*pool, round(price[i], 4), at))
        yield rows


# -- engines ----------------------------------------------------------------------------------


class Engine:
    name = ""

    def __init__(self, store: Store) -> None:
        self.store = store

    def load(self, chunks: Iterator[list[tuple[Any, ...]]]) -> int:
        raise NotImplementedError

    def sizes(self) -> dict[str, int]:
        raise NotImplementedError

    def compact(self) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        """Bring the planner's statistics and the visibility map up to date after a bulk
        change, as the database's own background maintenance would before long."""

    def plan(self, sql: str, params: Any) -> list[str]:
        raise NotImplementedError


class SqliteEngine(Engine):
    name = "sqlite"

    def __init__(self, store: Store, path: Path) -> None:
        super().__init__(store)
        self.path = path

    def load(self, chunks: Iterator[list[tuple[Any, ...]]]) -> int:
        db = sqlite3.connect(self.path)
        db.execute(f"DROP INDEX {HISTORY_INDEX}")
        names = ", ".join(COLUMNS)
        insert = f"INSERT INTO price_history ({names}, source) VALUES (?,?,?,?,?,?,?,'bench')"
        total = 0
        for rows in chunks:
            # The store's own text form of a UTC time on SQLite (UTCDateTime).
            db.executemany(insert, [(*r[:6], r[6].strftime("%Y-%m-%d %H:%M:%S.%f")) for r in rows])
            db.commit()
            total += len(rows)
        db.execute(
            f"CREATE INDEX {HISTORY_INDEX} ON price_history "
            "(provider, region, zone, instance_type, market, observed_at)"
        )
        db.commit()
        db.close()
        return total

    def sizes(self) -> dict[str, int]:
        files = sum(
            p.stat().st_size
            for p in self.path.parent.iterdir()
            if p.name.startswith(self.path.name)
        )
        with self.store.engine.connect() as conn:
            page = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
        return {"file_bytes": files, "in_use_bytes": (pages - free) * page}

    def compact(self) -> None:
        with self.store.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        self.store.engine.dispose()
        db = sqlite3.connect(self.path)
        db.execute("VACUUM")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()

    def plan(self, sql: str, params: Any) -> list[str]:
        with self.store.engine.connect() as conn:
            return [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params)]


class PostgresEngine(Engine):
    name = "postgresql"

    def __init__(self, store: Store, schema: str) -> None:
        super().__init__(store)
        self.schema = schema

    def load(self, chunks: Iterator[list[tuple[Any, ...]]]) -> int:
        conn = self.store.dedicated_connection()
        total = 0
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP INDEX {HISTORY_INDEX}")
                conn.commit()
                for rows in chunks:
                    with cur.copy(
                        f"COPY price_history ({', '.join(COLUMNS)}, source) FROM STDIN"
                    ) as copy:
                        for row in rows:
                            copy.write_row((*row, "bench"))
                    conn.commit()
                    total += len(rows)
                cur.execute(
                    f"CREATE INDEX {HISTORY_INDEX} ON price_history "
                    "(provider, region, zone, instance_type, market, observed_at)"
                )
                cur.execute("ANALYZE price_history")
                conn.commit()
        finally:
            conn.close()
        return total

    def sizes(self) -> dict[str, int]:
        with self.store.engine.connect() as conn:
            return {
                name: int(
                    conn.execute(text(f"SELECT pg_total_relation_size('{name}')")).scalar_one()
                )
                for name in ("price_history", "price_hourly")
            } | {
                "database_bytes": int(
                    conn.execute(
                        text(
                            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                            "JOIN pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE n.nspname = :s AND c.relkind = 'r'"
                        ),
                        {"s": self.schema},
                    ).scalar_one()
                )
            }

    def settle(self) -> None:
        # autovacuum runs on its own schedule after millions of inserted or deleted rows; a
        # timing taken while it scans the table measures it, not gpuopt.
        conn = self.store.dedicated_connection(autocommit=True)
        try:
            for name in ("price_history", "price_hourly", "job", "attempt", "cost_line"):
                conn.execute(f"VACUUM ANALYZE {name}")
        finally:
            conn.close()

    def compact(self) -> None:
        conn = self.store.dedicated_connection(autocommit=True)
        try:
            conn.execute("VACUUM FULL ANALYZE price_history")
            conn.execute("VACUUM FULL ANALYZE price_hourly")
        finally:
            conn.close()

    def plan(self, sql: str, params: Any) -> list[str]:
        with self.store.engine.connect() as conn:
            return [row[0] for row in conn.exec_driver_sql("EXPLAIN " + sql, params)]


@contextmanager
def sqlite_engine() -> Iterator[Engine]:
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-") as tmp:
        path = Path(tmp) / "gpuopt.db"
        with Store(f"sqlite:///{path}") as store:
            store.create_all()
            yield SqliteEngine(store, path)


def postgres_engine_factory(url: str) -> Callable[[], Any]:
    @contextmanager
    def postgres_engine() -> Iterator[Engine]:
        schema = f"gpuopt_bench_{uuid.uuid4().hex}"
        admin = create_engine(url)
        try:
            with admin.begin() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            with Store(url, schema=schema) as store:
                store.create_all()
                yield PostgresEngine(store, schema)
        finally:
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            admin.dispose()

    return postgres_engine


# -- measuring -----------------------------------------------------------------------------------


def count(store: Store, model: type[SQLModel]) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table(model))).scalar_one())


def load_timed(engine: Engine, pools: Sequence[tuple[str, ...]], days: int) -> tuple[int, float]:
    """The raw points of `days` days of polls of `pools` loaded; (points, seconds)."""
    started = time.perf_counter()
    points = engine.load(polls(pools, days, random.Random(SEED)))
    seconds = time.perf_counter() - started
    print(f"{engine.name:<10} loaded {points:,} raw points in {seconds:.1f} s")
    return points, seconds


def print_sizes(name: str, label: str, sizes: dict[str, int]) -> None:
    print(f"{name:<10} size {label}: {json.dumps({k: mib(v) for k, v in sizes.items()})} MiB")


def first_pass(store: Store, end: datetime, args: argparse.Namespace) -> dict[str, Any]:
    """The first retention pass at the end of the data, per day of data it summarized."""
    first = timed_pass(store, end, args.batch_rows)
    days = args.days - RETENTION.raw.days
    first["days_of_data"] = days
    first["seconds_per_day_of_data"] = round(first["seconds"] / max(days, 1), 3)
    return first


def compact_timed(engine: Engine) -> tuple[dict[str, int], float]:
    """The store compacted (VACUUM); (its sizes after, seconds)."""
    started = time.perf_counter()
    engine.compact()
    seconds = time.perf_counter() - started
    sizes = engine.sizes()
    print_sizes(engine.name, f"after compaction ({seconds:.1f} s)", sizes)
    return sizes, seconds


def timed_pass(store: Store, now: datetime, batch_rows: int) -> dict[str, Any]:
    """One retention pass at `now` by the daemon's loop, each batch timed."""
    batch_seconds: list[float] = []
    prune = store.prices.prune_history

    def timed(*args: Any, **kwargs: Any) -> PruneBatch:
        started = time.perf_counter()
        try:
            return prune(*args, **kwargs)
        finally:
            batch_seconds.append(time.perf_counter() - started)

    store.prices.prune_history = timed  # type: ignore[method-assign]
    try:
        loop = RetentionLoop(store, ManualClock(now), RETENTION, batch_rows=batch_rows)
        report = loop.run_once()
    finally:
        del store.prices.prune_history
    return {
        "seconds": round(report.seconds, 3),
        "batches": report.batches,
        "summarized": report.summarized,
        "hourly_rows_written": report.hours,
        "longest_batch_seconds": round(max(batch_seconds), 3),
        "median_batch_seconds": round(statistics.median(batch_seconds), 3),
    }


def ledger_reads(
    store: Store, pools: Sequence[tuple[str, ...]], days: int, attempts: int, rng: random.Random
) -> dict[str, Any]:
    """`attempts` calls of price_history with the prior point, as the ledger makes them."""
    span = days * 86400
    calls = []
    for _ in range(attempts):
        pool = rng.choice(pools)
        length = rng.uniform(3600, 72 * 3600)
        since = START + timedelta(seconds=rng.uniform(0, span - length))
        calls.append((pool, since, since + timedelta(seconds=length)))
    seconds, points = [], 0
    for pool, since, until in calls:
        started = time.perf_counter()
        got = store.prices.price_history(*pool, since=since, until=until, prior=True)
        seconds.append(time.perf_counter() - started)
        points += len(got)
    seconds.sort()
    return {
        "calls": attempts,
        "total_seconds": round(sum(seconds), 3),
        "p50_ms": round(seconds[len(seconds) // 2] * 1000, 3),
        "p99_ms": round(seconds[int(len(seconds) * 0.99)] * 1000, 3),
        "points_per_call": round(points / attempts, 1),
    }


def query_plan(engine: Engine, pool: tuple[str, ...]) -> list[str]:
    """The plan of the points-in-effect query, as the store sends it."""
    sent: list[tuple[str, Any]] = []

    def capture(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        sent.append((statement, params))

    sqlalchemy.event.listen(engine.store.engine, "before_cursor_execute", capture)
    try:
        engine.store.prices.price_history(
            *pool, since=START + timedelta(days=10), until=START + timedelta(days=11), prior=True
        )
    finally:
        sqlalchemy.event.remove(engine.store.engine, "before_cursor_execute", capture)
    statement, params = sent[-1]
    return engine.plan(statement, params)


def mib(n: int) -> float:
    return round(n / 2**20, 1)


def run(
    make: Callable[[], Any], pools: list[tuple[str, ...]], args: argparse.Namespace
) -> dict[str, Any]:
    with make() as engine:
        store = engine.store
        name = engine.name
        rows, load_seconds = load_timed(engine, pools, args.days)
        before = engine.sizes()
        print_sizes(name, "before", before)
        plan = query_plan(engine, pools[0])
        print(
            f"{name:<10} points-in-effect plan: " + " | ".join(p.strip() for p in plan if p.strip())
        )

        reads_raw = ledger_reads(store, pools, args.days, args.attempts, random.Random(SEED + 1))
        print(
            f"{name:<10} ledger reads, all raw: {reads_raw['calls']:,} calls in "
            f"{reads_raw['total_seconds']} s (p50 {reads_raw['p50_ms']} ms, "
            f"p99 {reads_raw['p99_ms']} ms)"
        )

        end = START + timedelta(days=args.days)
        first = first_pass(store, end, args)
        print(
            f"{name:<10} first pass: {first['summarized']:,} points "
            f"({first['days_of_data']} days) -> "
            f"{first['hourly_rows_written']:,} hourly rows in {first['seconds']} s = "
            f"{first['seconds_per_day_of_data']} s per day of data; {first['batches']} batches, "
            f"longest {first['longest_batch_seconds']} s"
        )
        after = engine.sizes()
        print_sizes(name, "after", after)

        steady = timed_pass(store, end + timedelta(days=1), args.batch_rows)
        print(
            f"{name:<10} next day's pass: {steady['summarized']:,} points in {steady['seconds']} s "
            f"({steady['batches']} batches, longest {steady['longest_batch_seconds']} s)"
        )
        hourly = timed_pass(store, end + timedelta(days=1, hours=1), args.batch_rows)
        print(
            f"{name:<10} the next hour's pass: {hourly['summarized']:,} points in "
            f"{hourly['seconds']} s ({hourly['batches']} batches, "
            f"longest {hourly['longest_batch_seconds']} s)"
        )
        idle = timed_pass(store, end + timedelta(days=1, hours=1), args.batch_rows)
        print(
            f"{name:<10} a pass with nothing to do: {idle['seconds']} s ({idle['batches']} batches)"
        )

        reads_tiered = ledger_reads(store, pools, args.days, args.attempts, random.Random(SEED + 1))
        print(
            f"{name:<10} ledger reads, both tiers: {reads_tiered['calls']:,} calls in "
            f"{reads_tiered['total_seconds']} s (p50 {reads_tiered['p50_ms']} ms, "
            f"p99 {reads_tiered['p99_ms']} ms)"
        )
        raw_left, hourly_rows = count(store, PriceHistory), count(store, PriceHourly)
        compacted, compact_seconds = compact_timed(engine)
        return {
            "engine": name,
            "raw_points_loaded": rows,
            "load_seconds": round(load_seconds, 1),
            "raw_points_left": raw_left,
            "hourly_rows": hourly_rows,
            "first_pass": first,
            "next_day_pass": steady,
            "next_hour_pass": hourly,
            "idle_pass": idle,
            "ledger_reads_all_raw": reads_raw,
            "ledger_reads_both_tiers": reads_tiered,
            "points_in_effect_plan": plan,
            "size_before": before,
            "size_after_pruning": after,
            "size_after_compaction": compacted,
            "compaction_seconds": round(compact_seconds, 1),
        }


def data_options(description: str, results: Path) -> argparse.ArgumentParser:
    """The options of the benches over a price history (this one and bench/ledger.py): its
    size, the engines and where the results go."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--pools", type=int, default=3000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--batch-rows", type=int, default=5_000, help="rows per pruning batch")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("GPUOPT_TEST_DATABASE_URL", "").strip() or None,
        help="PostgreSQL URL to bench as well (default: $GPUOPT_TEST_DATABASE_URL)",
    )
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--output", type=Path, default=results)
    return parser


def parse_data_options(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.days <= RETENTION.raw.days:
        parser.error(f"--days must be more than the raw retention ({RETENTION.raw.days})")
    return args


def engines(args: argparse.Namespace) -> list[Callable[[], Any]]:
    """A fresh SQLite store unless --skip-sqlite, and a PostgreSQL one for --database-url."""
    makers: list[Callable[[], Any]] = [] if args.skip_sqlite else [sqlite_engine]
    if args.database_url:
        url = normalize_database_url(args.database_url, origin="--database-url")
        if not is_sqlite_url(url):
            makers.append(postgres_engine_factory(url))
    return makers


def report_head(bench: str, command: str, args: argparse.Namespace, pools: int) -> dict[str, Any]:
    """What a results file says first: the bench, when, how it ran, on what."""
    return {
        "bench": bench,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command + (" --database-url postgresql://…" if args.database_url else ""),
        "python": platform.python_version(),
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "arch": platform.machine(),
        },
        "sqlalchemy": sqlalchemy.__version__,
        "sqlite": sqlite3.sqlite_version,
        "pools": pools,
        "days": args.days,
        "retention": {"raw_days": RETENTION.raw.days, "hourly_days": RETENTION.hourly.days},
    }


def write_report(report: dict[str, Any], output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {output}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = data_options(__doc__.splitlines()[0], RESULTS)
    args = parse_data_options(parser, argv)
    pools = make_pools(args.pools)
    print(
        f"{len(pools):,} pools x {args.days} days of 10-minute points = "
        f"{len(pools) * args.days * 144:,} rows"
    )
    results = [run(make, pools, args) for make in engines(args)]
    command = (
        f"python bench/prices_retention.py --pools {args.pools} --days {args.days} "
        f"--attempts {args.attempts} --batch-rows {args.batch_rows}"
    )
    report = report_head("prices_retention", command, args, len(pools))
    report.update(batch_rows=args.batch_rows, results=results)
    write_report(report, args.output)


if __name__ == "__main__":
    main()
