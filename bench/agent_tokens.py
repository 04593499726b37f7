"""How long authenticating an agent request takes at many attempts: `Jobs.attempt_by_token`
(the lookup every /agent/ request makes before its body is read, unauthenticated ones too)
with the index revision 0010 adds on `attempt.token_sha256`, and without it (as 0009 left it).

Makes a fresh SQLite file in a temp dir (or a throwaway PostgreSQL schema, dropped afterwards),
upgraded to the head, fills it with `--attempts` attempts (one job per 20 attempts), then times
`--lookups` lookups, half of known tokens and half of unknown ones (what a stranger's request
costs), with the index and again after dropping it. Prints figures and writes
bench/results/agent_tokens.json (agent_tokens_postgresql.json on PostgreSQL).

    python bench/agent_tokens.py [--attempts 200000] [--lookups 400] [--database-url postgresql://…]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import insert, text

from optimizer.store import Store, migrate, token_sha256
from optimizer.store.tables import Attempt, Job

RESULTS = Path(__file__).resolve().parent / "results"
AT = datetime(2026, 11, 30, tzinfo=UTC)
PER_JOB = 20
BATCH = 10_000


@contextmanager
def database(url: str | None) -> Iterator[Store]:
    """A fresh store upgraded to the head: a temp SQLite file, or a schema in `url`."""
    if url is None:
        with tempfile.TemporaryDirectory() as tmp, Store(f"sqlite:///{tmp}/bench.db") as store:
            migrate.upgrade(store.engine)
            yield store
        return
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in url else "?"
    try:
        with Store(f"{url}{sep}options=-csearch_path%3D{schema}") as store:
            migrate.upgrade(store.engine)
            yield store
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def fill(store: Store, attempts: int) -> None:
    jobs = [
        {
            "name": f"job-{j}",
            "policy": "p",
            "spec": "{}",
            "state": "succeeded",
            "restarts": 0,
            "created_at": AT,
            "updated_at": AT,
        }
        for j in range(attempts // PER_JOB + 1)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(Job.__table__), jobs)  # type: ignore[attr-defined]
        ids = [row[0] for row in conn.execute(text("SELECT id FROM job ORDER BY id"))]
    rows = (
        {
            "job_id": ids[i // PER_JOB],
            "number": i % PER_JOB + 1,
            "idempotency_key": f"a-{i}",
            "provider": "aws",
            "region": "us-east-1",
            "zone": "",
            "instance_type": "p5.48xlarge",
            "market": "spot",
            "usd_per_hour": 30.0,
            "state": "ended",
            "started_at": AT,
            "ended_at": AT,
            "token_sha256": token_sha256(f"token-{i}"),
            "instance_gone": True,
            "preempted": False,
        }
        for i in range(attempts)
    )
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH:
            with store.engine.begin() as conn:
                conn.execute(insert(Attempt.__table__), batch)  # type: ignore[attr-defined]
            batch = []
    if batch:
        with store.engine.begin() as conn:
            conn.execute(insert(Attempt.__table__), batch)  # type: ignore[attr-defined]
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE attempt"))


def time_lookups(store: Store, attempts: int, lookups: int) -> dict[str, float]:
    known = [token_sha256(f"token-{(i * 7919) % attempts}") for i in range(lookups // 2)]
    unknown = [token_sha256(f"stranger-{i}") for i in range(lookups // 2)]
    out: dict[str, float] = {}
    for name, hashes, expect in (("known", known, True), ("unknown", unknown, False)):
        times = []
        for sha in hashes:
            started = time.perf_counter()
            found = store.jobs.attempt_by_token(sha)
            times.append(time.perf_counter() - started)
            assert (found is not None) is expect
        out[f"{name}_median_ms"] = round(statistics.median(times) * 1000, 3)
        out[f"{name}_max_ms"] = round(max(times) * 1000, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=200_000)
    parser.add_argument("--lookups", type=int, default=400)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    with database(args.database_url) as store:
        engine = store.engine.dialect.name
        started = time.perf_counter()
        fill(store, args.attempts)
        filled = time.perf_counter() - started
        indexed = time_lookups(store, args.attempts, args.lookups)
        with store.engine.begin() as conn:
            conn.execute(text("DROP INDEX ix_attempt_token_sha256"))
        if engine == "postgresql":
            with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE attempt"))
        scanned = time_lookups(store, args.attempts, args.lookups)

    result = {
        "bench": "agent_tokens",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "arch": platform.machine(),
        },
        "sqlalchemy": sqlalchemy.__version__,
        "engine": engine,
        "attempts": args.attempts,
        "lookups": args.lookups,
        "fill_seconds": round(filled, 1),
        "with_index": indexed,
        "without_index": scanned,
    }
    print(json.dumps(result, indent=2))
    name = "agent_tokens.json" if engine == "sqlite" else f"agent_tokens_{engine}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
