"""The daemon's footprint: idle memory, torch kept out, CLI start-up, one reconcile pass.

1. Idle RSS: starts a real `gpuopt daemon` (default config: SQLite in a temp data dir, the
   embedded local provider, an ephemeral port), waits until /readyz says the first polls are
   done and /metrics counts the snapshot's offers, lets it idle, then reads VmRSS and VmHWM
   from /proc/PID/status. Also reads `gpuopt_info{torch_loaded=…}` from /metrics: whether
   torch is in the daemon's sys.modules. The default config has no policy, so nothing is
   ranked; the same is measured again with one policy in force (examples/
   local-train-policy.yaml), ranked after the first polls (the columnar engine: numpy, and
   pyarrow for the offer table's text columns).
2. `gpuopt --help` wall time: the median of several runs of the installed entry point.
3. One reconcile pass over 1,000 stored jobs, in process: `ReconcileLoop.run_once()` reads
   the live jobs and calls the hook's reconcilers; measured with no reconciler and with a
   trivial one (looks up each job's policy in the registry and counts states). No provider
   is called: this is the loop's own cost, not the job state machine's (not built yet).

Prints figures and writes bench/results/daemon.json. Targets: RSS <= 120 MB (the default
config), --help <= 0.5 s.

    python bench/daemon.py [--help-runs 7] [--passes 20] [--idle-s 3] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "daemon.json"
POLICY = ROOT / "examples" / "local-train-policy.yaml"

if not __package__:
    # Run as a file (`python bench/daemon.py`): the tests' helpers it uses are the package
    # `tests.helpers` of the repository root, so run this file as the module bench.daemon
    # from there, where `python -m` finds both packages.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.daemon", *sys.argv[1:]])
RSS_TARGET_MB = 120.0
HELP_TARGET_S = 0.5
JOBS = 1_000


def _proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, in MB (10^6 bytes) and MiB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            kib = int(value.split()[0])
            out[f"{key}_mb"] = round(kib * 1024 / 1e6, 1)
            out[f"{key}_mib"] = round(kib / 1024, 1)
    return out


def _metric(text: str, name: str) -> list[tuple[str, float]]:
    """(labels, value) for every sample of one metric in Prometheus text."""
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            found.append((labels[len(name) :], float(value)))
    return found


def idle_daemon(idle_s: float, policy: Path | None = None) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="gpuopt-bench-"))
    if policy is not None:  # the default policy folder, under the data directory
        (data / "policies").mkdir(mode=0o700)
        shutil.copy(policy, data / "policies" / policy.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    env["GPUOPT_DATA_DIR"] = str(data)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "optimizer.cli", "daemon", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"API at (http://\S+)", first)
        if not match:
            raise RuntimeError(f"the daemon did not say where its API is: {first!r}")
        url = match.group(1)
        deadline = time.monotonic() + 120
        offers: list[tuple[str, float]] = []
        while time.monotonic() < deadline:
            ready = httpx.get(f"{url}/readyz", timeout=5).status_code == 200
            metrics = httpx.get(f"{url}/metrics", timeout=5).text
            offers = _metric(metrics, "gpuopt_offers")
            if ready and sum(v for _, v in offers) > 0:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("the daemon did not load offers within 120 s")
        ready_s = time.perf_counter() - started
        time.sleep(idle_s)  # let the first polls' garbage go and the loops settle
        memory = _proc_status(proc.pid)
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        info = _metric(metrics, "gpuopt_info")
        torch_loaded = bool(info) and 'torch_loaded="true"' in info[0][0]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)
    return {
        "policies": [policy.relative_to(ROOT).as_posix()] if policy else [],
        "ready_seconds": round(ready_s, 2),
        "idle_seconds": idle_s,
        **memory,
        "offers": {labels: int(v) for labels, v in offers},
        "torch_loaded": torch_loaded,
        "torch_installed": _torch_installed(),
        "exit_code_on_sigterm": code,
    }


def _torch_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("torch") is not None


def help_time(runs: int) -> dict[str, Any]:
    exe = shutil.which("gpuopt", path=str(Path(sys.executable).parent)) or "gpuopt"
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([exe, "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return {
        "command": "gpuopt --help",
        "runs": runs,
        "median_seconds": round(statistics.median(times), 3),
        "min_seconds": round(min(times), 3),
        "max_seconds": round(max(times), 3),
    }


def _running_jobs(store: Any) -> Any:
    """Every stored job running on a registered attempt (the steady state), and a registry
    with their policies loaded. No provider is configured, so describe is skipped."""
    from optimizer.daemon.policies import LoadedPolicy, PolicyRegistry
    from policies.loader import parse_policy
    from tests.helpers import make_offer  # the tests' offer factory

    now = datetime.now(UTC)
    offer = make_offer(provider="local", region="eu-west-1", zone="eu-west-1-a", observed_at=now)
    for job in store.jobs.list_jobs():
        key = f"{job.id}-1"
        store.jobs.create_attempt(job.id, 1, key, offer, "h", now)
        store.jobs.update_attempt(
            key,
            instance_id=f"i-{job.id}",
            registered_at=now,
            job_started_at=now,
            probe_status="pass",
            state="launched",
        )
        store.jobs.transition_job(
            job.id, expected=job.state, state="running", reason="attempt 1: running", at=now
        )
    registry = PolicyRegistry()
    text = "apiVersion: gpuopt/v1\nkind: Policy\nname: {}\n"
    registry.swap(
        {
            f"policy-{i}": LoadedPolicy(
                f"policy-{i}", parse_policy(text.format(f"policy-{i}")), "bench", "0", now
            )
            for i in range(10)
        }
    )
    return registry


def reconcile_pass(passes: int, database_url: str | None) -> list[dict[str, Any]]:
    from optimizer.alerts import Emitter, Router
    from optimizer.daemon.loops.reconcile import ReconcileLoop
    from optimizer.daemon.policies import PolicyRegistry
    from optimizer.jobs.context import ReconcileContext
    from optimizer.store import Store

    engines: list[tuple[str, str, str | None]] = []
    folder = Path(tempfile.mkdtemp(prefix="gpuopt-bench-"))
    engines.append(("sqlite", f"sqlite:///{folder / 'bench.db'}", None))
    if database_url:
        engines.append(("postgresql", database_url, f"bench_{uuid.uuid4().hex[:12]}"))

    from optimizer.jobs.reconcile import JobReconciler

    def trivial(ctx: ReconcileContext) -> None:
        states = Counter(j.state for j in ctx.jobs)
        missing = [j.name for j in ctx.jobs if j.policy not in ctx.policies]
        assert states and len(missing) == len(ctx.jobs)  # no policies loaded in the bench

    out = []
    try:
        for engine, url, schema in engines:
            if schema:
                from sqlalchemy import create_engine, text

                admin = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
                with admin.begin() as conn:
                    conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            try:
                with Store(url, schema=schema) as store:
                    store.create_all()
                    spec = {"run": "python train.py", "checkpoint_dir": "s3://b/c", "env": {}}
                    t0 = time.perf_counter()
                    for i in range(JOBS):
                        store.jobs.add_job(f"job-{i:04d}", f"policy-{i % 10}", spec)
                    submit_s = time.perf_counter() - t0
                    emitter = Emitter(store.events, Router([], []))
                    registry = _running_jobs(store)
                    for label, reconcilers in (
                        ("no reconciler", []),
                        ("trivial reconciler", [trivial]),
                        ("job reconciler, jobs running", [JobReconciler(lambda: "http://x")]),
                    ):
                        loop = ReconcileLoop(
                            store,
                            registry if "job" in label else PolicyRegistry(),
                            emitter,
                            lambda: datetime.now(UTC),
                            reconcilers=list(reconcilers),
                        )
                        loop.run_once()  # warm the connection pool and statement cache
                        times = []
                        for _ in range(passes):
                            t0 = time.perf_counter()
                            report = loop.run_once()
                            times.append(time.perf_counter() - t0)
                        assert report.jobs == JOBS and not report.errors
                        out.append(
                            {
                                "engine": engine,
                                "reconcilers": label,
                                "jobs": JOBS,
                                "passes": passes,
                                "median_ms": round(statistics.median(times) * 1000, 2),
                                "max_ms": round(max(times) * 1000, 2),
                                "submit_1000_jobs_seconds": round(submit_s, 2),
                            }
                        )
            finally:
                if schema:
                    with admin.begin() as conn:
                        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
                    admin.dispose()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--help-runs", type=int, default=7)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--database-url", default=os.environ.get("GPUOPT_TEST_DATABASE_URL"))
    args = parser.parse_args()

    daemon = idle_daemon(args.idle_s)
    ranking = idle_daemon(args.idle_s, POLICY)
    for label, found in (("idle daemon", daemon), ("idle daemon, one policy", ranking)):
        print(
            f"{label}: VmRSS {found['VmRSS_mb']} MB ({found['VmRSS_mib']} MiB), "
            f"peak {found['VmHWM_mb']} MB; ready in {found['ready_seconds']} s; "
            f"offers {found['offers']}; torch loaded: {found['torch_loaded']} "
            f"(installed: {found['torch_installed']}); "
            f"SIGTERM exit {found['exit_code_on_sigterm']}"
        )
    cli = help_time(args.help_runs)
    print(f"gpuopt --help: median {cli['median_seconds']} s over {cli['runs']} runs")
    passes = reconcile_pass(args.passes, args.database_url)
    for row in passes:
        print(
            f"reconcile pass, {row['jobs']} jobs, {row['engine']}, {row['reconcilers']}: "
            f"median {row['median_ms']} ms (max {row['max_ms']} ms)"
        )
    result = {
        "bench": "daemon",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "arch": platform.machine(),
            # Other processes' load: RSS does not depend on it, the --help time does.
            "load_average_1m": round(os.getloadavg()[0], 2),
            "affinity": sorted(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else None,
        },
        "command": " ".join(["python bench/daemon.py", *sys.argv[1:]]),
        "idle_daemon": daemon,
        "idle_daemon_one_policy": ranking,
        "cli_help": cli,
        "reconcile_pass": passes,
        "targets": {
            "rss_mb": RSS_TARGET_MB,
            "rss_met": daemon["VmRSS_mb"] <= RSS_TARGET_MB,
            "help_s": HELP_TARGET_S,
            "help_met": cli["median_seconds"] <= HELP_TARGET_S,
            "torch_absent": not (daemon["torch_loaded"] or ranking["torch_loaded"]),
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
