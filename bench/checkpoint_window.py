"""The checkpoint window's error: when the old job's SIGTERM came, against power-off - allowance.

Each run starts a real `gpuopt daemon` process (its own data directory, the embedded local
cloud, an ephemeral port), submits a job that records the wall-clock time its SIGTERM arrived,
waits for it to run, takes the local cloud's capacity away (so the replacement cannot launch
and the stop is the window's, not a ready replacement's), and posts a spot notice of
`--notice-s` seconds through the local cloud (a list is cycled over the runs). Per run:

- **error**: the job's SIGTERM - (the local cloud's power-off - the job's allowance), the
  power-off being the instant the local cloud powers the instance off (its notice gives it to
  the millisecond);
- **by**: who stopped the job: the agent at the window (its own stop) or the daemon's command;
- **daemon_stop_error**: the daemon's recorded stop (its alarm's pass, `stop_sent_at`, the
  pass's start) - the same instant: how close the daemon's own timer comes, without the trip
  to the agent (null where the job had exited, a second after the agent's own stop, before a
  pass could record it: a pass busy with the failing launches on a loaded host);
- **notice_seen_s**: the notice -> the daemon recording it (the agent polls the metadata every
  0.5 s, so a window shorter than that cannot be kept).

Then `--delivery-runs` runs where the replacement may launch and a 120 s notice leaves it time
to be ready first: the daemon's recorded stop (`stop_sent_at`) -> the job's SIGTERM, the trip
a stop for a ready replacement takes (the agent asks for its commands every 0.25 s after a
notice, rather than at its 2 s heartbeat).

Target (issue 31): |error| <= 0.5 s. The figures are the daemon's and the agent's timing on
this host; a GPU changes none of them (the job holds no GPU here). Writes
bench/results/checkpoint_window.json.

    python bench/checkpoint_window.py [--runs 5] [--notice-s 30,26,24] [--allowance-s 20]

`measure(runs, notices, allowance_s)` returns the same figures, for bench/handover.py.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    # Run as a file: the tests' helpers it uses are the package `tests.helpers` of the
    # repository root, so run this file as the module bench.checkpoint_window from there.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.checkpoint_window", *sys.argv[1:]])

from optimizer.store import Store  # noqa: E402
from providers.local import LocalCloud  # noqa: E402
from tests.helpers import wait_until, write_policy  # noqa: E402
from tests.helpers.daemon import DaemonProcess  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "checkpoint_window.json"
TARGET_S = 0.5
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: bench-window
workload: {gpus: 1, gpu_memory_gib: 12, gpu_models: [T4]}
markets: [spot]
placement: {providers: [local], regions: {allow: [eu-north-1]}}
recovery: {max_restarts: 50, pool_cooldown_minutes: 0, on_demand_after_interruptions: 100}
"""
# One region's T4s: a pass after the capacity is gone tries a dozen launches, not every offer (which
# made the daemon's passes seconds long on a loaded host, hiding its own stop's timing).
# The job: its SIGTERM's wall-clock time, as the first statement of its handler; then a
# checkpoint of a second (so the daemon's own stop, due at the same instant, is still recorded
# while the job has not exited: `daemon_stop_error_s`).
JOB = """\
import os, signal, sys, time
log = sys.argv[1]
def line(what, t):
    with open(log, "a") as f:
        f.write(f"{what} {t!r}\\n")
def term(*_):
    line("term", time.time())
    time.sleep(1.0)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
line("start", time.time())
while True:
    time.sleep(0.005)
"""


def _ts(value: datetime | None) -> float | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _marks(log: Path) -> dict[str, float]:
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return {}
    return {what: float(t) for what, t in (ln.split() for ln in lines if ln.count(" ") == 1)}


def one_run(
    base: Path, notice_s: float, allowance_s: float, *, replacement: bool = False
) -> dict[str, Any]:
    """One daemon, one job, one notice: the row of figures. `replacement`: let the
    replacement launch (a notice long enough that it is ready first), to time the daemon's
    stop's trip to the job instead."""
    data = base / "data"
    data.mkdir(parents=True)
    write_policy(data / "policies", "bench.yaml", POLICY)
    script, log = base / "window_job.py", base / "window.log"
    script.write_text(JOB)
    daemon = DaemonProcess(data, timeout=120)
    cloud = LocalCloud(data / "local-cloud")
    store = Store(f"sqlite:///{data / 'gpuopt.db'}")
    try:
        body = {
            "name": "window",
            "policy": "bench-window",
            "run": f"{sys.executable} {script} {log}",
            "checkpoint_dir": str(base / "ckpt"),
            "checkpoint_allowance_s": allowance_s,
            "probes": "none",
        }
        with daemon.client() as client:
            client.post("/jobs", json=body).raise_for_status()
        wait_until(lambda: "start" in _marks(log), 120, "the job to start")
        job = store.jobs.get_job("window")
        assert job is not None
        old = next(a for a in store.jobs.attempts(job.id) if a.number == 1)
        assert old.instance_id is not None
        if not replacement:
            cloud.fail_next("*", "capacity", times=10_000)  # none: the window stops the job
        record = cloud.interrupt(old.instance_id, grace_s=notice_s)
        assert record.interruption is not None
        notice, power_off = record.interruption.notice_at, record.interruption.kill_at
        due = power_off - allowance_s
        wait_until(lambda: "term" in _marks(log), notice_s + 60, "the job's SIGTERM")
        term = _marks(log)["term"]
        stopped = wait_until(
            lambda: next(
                (e for e in store.jobs.agent_events(old.key) if e["kind"] == "stopped"), None
            ),
            30,
            "the agent's stopped report",
        )
        after = next(a for a in store.jobs.attempts(job.id) if a.number == 1)
        reason = str((stopped.get("data") or {}).get("reason") or "")
        daemon_stop = _ts(after.stop_sent_at)
        seen = _ts(after.notice_at)
        if replacement:
            return {
                "notice_s": notice_s,
                "reason": reason,
                "stop_recorded_after_notice_s": None
                if daemon_stop is None
                else round(daemon_stop - notice, 3),
                "stop_to_sigterm_s": None if daemon_stop is None else round(term - daemon_stop, 3),
            }
        return {
            "notice_s": notice_s,
            "allowance_s": allowance_s,
            "due_after_notice_s": round(due - notice, 3),
            "error_s": round(term - due, 3),
            "by": "agent" if "agent's own stop" in reason else "daemon",
            "reason": reason,
            "daemon_stop_error_s": None if daemon_stop is None else round(daemon_stop - due, 3),
            "notice_seen_s": None if seen is None else round(seen - notice, 3),
            "checkpoint_time_given_s": round(power_off - term, 3),
        }
    finally:
        daemon.stop()
        cloud.kill_all()
        cloud.close()
        store.close()


def measure(runs: int, notices: list[float], allowance_s: float) -> dict[str, Any]:
    """`runs` runs, the notice lengths cycled; the rows and their summary."""
    rows = []
    for n in range(runs):
        with tempfile.TemporaryDirectory(prefix="gpuopt-bench-window-") as tmp:
            rows.append(one_run(Path(tmp), notices[n % len(notices)], allowance_s))
        print(json.dumps(rows[-1]), flush=True)
    errors = [r["error_s"] for r in rows]
    worst = max(abs(e) for e in errors)
    return {
        "runs": rows,
        "error_s": {
            "median": round(statistics.median(errors), 3),
            "min": min(errors),
            "max": max(errors),
            "worst_abs": worst,
        },
        "daemon_stop_error_s": [r["daemon_stop_error_s"] for r in rows],
        "target_abs_s": TARGET_S,
        "meets_target": worst <= TARGET_S,
    }


def measure_delivery(runs: int, notice_s: float = 120.0) -> dict[str, Any]:
    """The replacement ready before the window: how long the daemon's recorded stop takes to
    reach the job (the agent asks for its commands every 0.25 s after a notice)."""
    rows = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="gpuopt-bench-window-") as tmp:
            rows.append(one_run(Path(tmp), notice_s, 20.0, replacement=True))
        print(json.dumps(rows[-1]), flush=True)
    trips = [r["stop_to_sigterm_s"] for r in rows if r["stop_to_sigterm_s"] is not None]
    return {
        "runs": rows,
        "stop_to_sigterm_s": {"median": round(statistics.median(trips), 3), "max": max(trips)}
        if trips
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--notice-s",
        default="30,26,24",
        help="the notice's length (s), a comma list cycled over the runs (30 s is GCP's)",
    )
    parser.add_argument("--allowance-s", type=float, default=20.0)
    parser.add_argument(
        "--delivery-runs",
        type=int,
        default=2,
        help="runs where the replacement is ready first: the daemon's stop -> the job's SIGTERM",
    )
    args = parser.parse_args(argv)
    notices = [float(x) for x in args.notice_s.split(",") if x.strip()]
    began = time.monotonic()
    result = {
        "bench": "checkpoint_window",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        **measure(args.runs, notices, args.allowance_s),
        "replacement_ready_first": measure_delivery(args.delivery_runs)
        if args.delivery_runs
        else None,
        "python": platform.python_version(),
        "cores": len(os.sched_getaffinity(0)),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "wall_s": round(time.monotonic() - began, 1),
        "command": "python bench/checkpoint_window.py " + " ".join(argv or sys.argv[1:]),
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    summary = result["error_s"]
    print(
        f"window error (SIGTERM - (power-off - allowance)) over {args.runs} runs: median "
        f"{summary['median']:+.3f} s, min {summary['min']:+.3f}, max {summary['max']:+.3f} "
        f"(target |error| <= {TARGET_S} s); daemon's own stop: {result['daemon_stop_error_s']}; "
        f"load average {result['load_average_1m']} on {result['cores']} cores"
    )
    delivery = result["replacement_ready_first"]
    if delivery is not None:
        print(
            f"replacement ready first: the daemon's stop -> SIGTERM {delivery['stop_to_sigterm_s']}"
        )
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
