"""How fast a follower takes over when the leader goes, with real daemon processes.

Two `gpuopt daemon` processes share one PostgreSQL schema and data directory. Each round
stops the leader (SIGKILL: the process dies, PostgreSQL sees its session end; or SIGTERM: a
clean stop that releases the lock) and measures, from the signal:

- takeover: until the other replica's `/readyz` reports `"role": "leader"`;
- first reconcile: until that replica has finished a reconcile pass as leader
  (`gpuopt_loop_runs_total{loop="reconcile"}` goes up; ticks are 600 s apart, so only the
  takeover's own pass counts).

A replacement replica is started after each round, so every round has a leader and one
follower. Target (issue): takeover within 15 s of the leader's connection dying.
Writes bench/results/failover.json.

    python bench/failover.py [--rounds 5] [--database-url postgresql://…/test]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    # Run as a file (`python bench/failover.py`): the tests' helpers it uses are the package
    # `tests.helpers` of the repository root, so run this file as the module bench.failover
    # from there, where `python -m` finds both packages.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.failover", *sys.argv[1:]])

from sqlalchemy import create_engine, text  # noqa: E402

from optimizer.store import normalize_database_url  # noqa: E402
from tests.helpers import DaemonProcess, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "failover.json"
SLOW_TICKS = {
    "GPUOPT_LOOPS__RECONCILE_S": "600",
    "GPUOPT_PROVIDERS__LOCAL__SPOT_INTERVAL_S": "3600",
}


def start_replica(data: Path, database_url: str) -> DaemonProcess:
    """One more `gpuopt daemon` on the shared data directory and database, ticking slowly."""
    log = data.parent / f"replica-{len(list(data.parent.glob('replica-*')))}.log"
    return DaemonProcess(data, env={"GPUOPT_DATABASE_URL": database_url, **SLOW_TICKS}, log=log)


def reconcile_runs(replica: DaemonProcess) -> float:
    return replica.reconcile_passes()


def one_round(replicas: list[DaemonProcess], how: signal.Signals) -> dict[str, Any]:
    leader = next(r for r in replicas if r.role() == "leader")
    follower = next(r for r in replicas if r is not leader)
    before = reconcile_runs(follower)
    sent = time.monotonic()
    leader.proc.send_signal(how)
    wait_until(lambda: follower.role() == "leader", timeout=30, what="the takeover")
    took = time.monotonic() - sent
    wait_until(lambda: reconcile_runs(follower) > before, timeout=30, what="a reconcile pass")
    acted = time.monotonic() - sent
    leader.proc.wait(timeout=60)
    replicas.remove(leader)
    return {
        "signal": how.name,
        "takeover_s": round(took, 3),
        "first_reconcile_s": round(acted, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per signal")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "GPUOPT_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    args = parser.parse_args()
    url = normalize_database_url(args.database_url)
    schema = f"gpuopt_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in args.database_url else "?"
    database_url = f"{args.database_url}{sep}options=-csearch_path%3D{schema}"
    rows: list[dict[str, Any]] = []
    replicas: list[DaemonProcess] = []
    try:
        with tempfile.TemporaryDirectory(prefix="gpuopt-failover-") as tmp:
            data = Path(tmp) / "data"
            data.mkdir()
            replicas.append(start_replica(data, database_url))
            wait_until(lambda: replicas[0].role() == "leader", timeout=30, what="a leader")
            for how in [signal.SIGKILL] * args.rounds + [signal.SIGTERM] * args.rounds:
                replicas.append(start_replica(data, database_url))
                wait_until(lambda: replicas[-1].role() == "follower", timeout=30)
                rows.append(one_round(replicas, how))
                print(json.dumps(rows[-1]), flush=True)
            for replica in replicas:
                replica.stop()
    finally:
        for replica in replicas:
            if replica.proc.poll() is None:
                replica.proc.kill()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()

    def summary(name: str, key: str) -> dict[str, float]:
        values = [r[key] for r in rows if r["signal"] == name]
        return {"median": statistics.median(values), "max": max(values)}

    result = {
        "bench": "failover",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cores": len(os.sched_getaffinity(0)),
        "leader_check_s": 2.0,
        "rounds": rows,
        "takeover_s": {s: summary(s, "takeover_s") for s in ("SIGKILL", "SIGTERM")},
        "first_reconcile_s": {s: summary(s, "first_reconcile_s") for s in ("SIGKILL", "SIGTERM")},
        "target_takeover_s": 15.0,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for name in ("SIGKILL", "SIGTERM"):
        print(
            f"{name}: takeover median {result['takeover_s'][name]['median']} s, "
            f"max {result['takeover_s'][name]['max']} s; first reconcile as leader median "
            f"{result['first_reconcile_s'][name]['median']} s (target takeover <= 15 s)"
        )


if __name__ == "__main__":
    main()
