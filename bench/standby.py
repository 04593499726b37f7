"""Standby start, measured: the old job's last step → the new job's first step, with and without
`standby: true`, through the whole managed flow on the local cloud.

A real `gpuopt daemon` process (its own data directory, the embedded local cloud) runs the
example job (examples/train_with_checkpoints.py, torch: CPU here, CUDA with `--gpu` where the
host has it), its checkpoints in a local bucket; the bench interrupts the running attempt
`--interruptions` times through the local cloud, once for a job spec without `standby` and
once for the same spec with it, and reports per interruption, from the job's step log (each
step's wall-clock time) and the daemon's records (the agents' events):

- **last step → first step**: the old job's last step → the new job's first step;
- **exit → first step**: the old job's `job_exited` event → the new job's first step;
- **process started before the go** (standby): the new job's process start (`job_started`'s
  `standby_since`) → its go (`job_started`'s time): the start-up standby hid;
- **go → first step**: the time between the go (or, without standby, the process start) and
  the first step: what the job still does after it (loading the checkpoint; without standby,
  its imports and model too); and before it, the old job's last step → its final checkpoint
  committed to the bucket (its SIGTERM, save and upload), and that → the go (the fence
  lifting, the agent's next fence poll, the restore);
- **the go's wake-up**: three processes waiting in `wait_for_go`, the go given, each one's
  wake-up after it (milliseconds; 5 rounds).

The issue's target (on an H200, torch import and CUDA init included): last step → first step
<= 0.5 s with standby. Here torch runs on the CPU of a loaded host and the daemon, the local
cloud and the agents share it: the figures compare the two paths on one host, and the fence
poll (0.25 s) is in both. Writes bench/results/standby.json (standby_gpu.json with `--gpu`).

    python bench/standby.py [--interruptions 2] [--gpu]

`measure(standby, interruptions, ...)` is the one function, for another bench to call.
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
    # repository root, so run this file as the module bench.standby from there.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.standby", *sys.argv[1:]])

from optimizer.clock import parse_utc  # noqa: E402
from optimizer.store import Store  # noqa: E402
from providers.local import LocalCloud  # noqa: E402
from tests.helpers import wait_until, write_policy  # noqa: E402
from tests.helpers.daemon import DaemonProcess  # noqa: E402

RESULTS = ROOT / "bench" / "results"
EXAMPLE = ROOT / "examples" / "train_with_checkpoints.py"
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: bench-standby
workload: {gpus: 1, gpu_memory_gib: 12}
markets: [spot]
placement: {providers: [local]}
recovery: {max_restarts: 50, pool_cooldown_minutes: 0, on_demand_after_interruptions: 100}
"""
TARGET_S = 0.5  # last step → first step with standby, on an H200 (the issue)
POLL = 0.05  # how often the bench looks (its figures come from the records, not from this)


def _steps(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _of(lines: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    return [x for x in lines if x.get("attempt") == str(attempt)]


def _epoch(value: datetime | str | None) -> float | None:
    """An event's time (the store's datetime, naive meaning UTC, or UTC text) in seconds."""
    if not value:
        return None
    when = parse_utc(value) if isinstance(value, str) else value
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class Run:
    """One daemon, one job (with or without standby), interrupted again and again."""

    def __init__(self, base: Path, *, standby: bool, step_sleep: float) -> None:
        self.standby = standby
        self.step_sleep = step_sleep
        self.data = base / "data"
        self.data.mkdir(parents=True)
        write_policy(self.data / "policies", "bench.yaml", POLICY)
        self.step_log = base / "steps.jsonl"
        self.bucket = base / "bucket"
        self.daemon = DaemonProcess(self.data, timeout=120)
        self.store = Store(f"sqlite:///{self.data / 'gpuopt.db'}")
        self.cloud = LocalCloud(self.data / "local-cloud")

    def submit(self) -> int:
        run = [
            sys.executable,
            str(EXAMPLE),
            *("--engine", "torch", "--steps", "1000000", "--checkpoint-every", "200"),
            *("--step-sleep", str(self.step_sleep), "--log-every", "1000"),
        ]
        body = {
            "name": "standby" if self.standby else "plain",
            "policy": "bench-standby",
            "workdir": str(ROOT),
            "run": " ".join(run),
            "checkpoint": f"file://{self.bucket}",
            "probes": "none",
            "standby": self.standby,
            "env": {"STEP_LOG": str(self.step_log)},
        }
        with self.daemon.client() as client:
            client.post("/jobs", json=body).raise_for_status()
        job = wait_until(lambda: self.store.jobs.get_job(body["name"]), 30, "the job's row")
        return int(job.id)

    def attempt(self, job_id: int, number: int) -> Any:
        return next((a for a in self.store.jobs.attempts(job_id) if a.number == number), None)

    def _event(self, key: str, kind: str) -> dict[str, Any] | None:
        return next((e for e in self.store.jobs.agent_events(key) if e["kind"] == kind), None)

    def interrupt_once(self, job_id: int, number: int, notice_s: float) -> dict[str, Any]:
        lines = lambda: _of(_steps(self.step_log), number)  # noqa: E731
        wait_until(lambda: len(lines()) >= 20, 240, f"attempt {number}'s 20 steps", interval=POLL)
        old = self.attempt(job_id, number)
        # Let the job run a little past its first steps, as a job does.
        wait_until(lambda: len(lines()) >= 40, 60, "40 steps", interval=POLL)
        self.cloud.interrupt(old.instance_id, grace_s=notice_s)
        new_no = number + 1
        wait_until(
            lambda: _of(_steps(self.step_log), new_no), 240, f"attempt {new_no}'s first step"
        )
        new = wait_until(lambda: self.attempt(job_id, new_no), 10, "the new attempt")
        started = wait_until(lambda: self._event(new.key, "job_started"), 60, "job_started")
        exited = wait_until(lambda: self._event(old.key, "job_exited"), 120, "job_exited")
        steps = _steps(self.step_log)
        last, first = _of(steps, number)[-1], _of(steps, new_no)[0]
        go_at = _epoch(started["at"])
        since = _epoch((started.get("data") or {}).get("standby_since"))
        hidden = None if since is None or go_at is None else go_at - since
        exit_at = _epoch(exited["at"])
        finals = [
            e
            for e in self.store.jobs.agent_events(old.key)
            if e["kind"] == "checkpoint_committed" and (e.get("data") or {}).get("final")
        ]
        final_at = _epoch(finals[0]["at"]) if finals else None
        return {
            "attempt": new_no,
            "standby": bool((started.get("data") or {}).get("standby")),
            "last_step_to_first_step_s": _round(first["t"] - last["t"]),
            # The stages: the old job's SIGTERM, checkpoint and its upload; the fence lifting
            # on it, the agent seeing that, the restore; the go (or process start) onwards.
            "last_step_to_final_checkpoint_s": _round(
                None if final_at is None else final_at - last["t"]
            ),
            "final_checkpoint_to_go_s": _round(
                None if final_at is None or go_at is None else go_at - final_at
            ),
            "exit_to_first_step_s": _round(None if exit_at is None else first["t"] - exit_at),
            "process_before_go_s": _round(hidden),
            "go_to_first_step_s": _round(None if go_at is None else first["t"] - go_at),
            "steps_lost": last["step"] - (first["step"] - 1),
        }

    def close(self) -> None:
        self.daemon.stop()
        self.cloud.kill_all()
        self.cloud.close()


def measure(
    standby: bool,
    interruptions: int,
    *,
    notice_s: float = 30.0,
    step_sleep: float = 0.05,
    keep: Path | None = None,
) -> list[dict[str, Any]]:
    """Run the example job under a daemon on the local cloud and interrupt it `interruptions`
    times; a row per handover (see the module's docstring). `keep`: a folder to run in and
    leave behind (the daemon's data, the agents' logs), instead of a temporary one."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-standby-") as tmp:
        base = Path(tmp) if keep is None else keep / ("standby" if standby else "plain")
        run = Run(base, standby=standby, step_sleep=step_sleep)
        try:
            job_id = run.submit()
            for n in range(1, interruptions + 1):
                rows.append(run.interrupt_once(job_id, n, notice_s))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            run.close()
    return rows


def go_wakeups(rounds: int = 5, waiters: int = 3) -> list[float]:
    """Milliseconds from `give` to each waiter's return from `wait_for_go`, real processes."""
    import subprocess

    from optimizer import standby

    code = (
        "import sys, time; from optimizer.standby import wait_for_go; "
        "open(sys.argv[2], 'w').close(); wait_for_go(path=sys.argv[1]); print(time.time())"
    )
    out: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-go-") as tmp:
        for n in range(rounds):
            go = Path(tmp) / f"go-{n}"
            standby.prepare(go)
            marks = [Path(tmp) / f"ready-{n}-{i}" for i in range(waiters)]
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", code, str(go), str(mark)],
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
                for mark in marks
            ]
            wait_until(lambda: all(m.exists() for m in marks), 60, "the waiters")  # noqa: B023
            time.sleep(0.2)  # into their poll() (the ready mark comes just before it)
            given = time.time()
            standby.give(go)
            out += [(float(p.communicate()[0]) - given) * 1000 for p in procs]
    return [round(x, 2) for x in out]


def _summary(rows: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interruptions", type=int, default=2)
    parser.add_argument("--notice-s", type=float, default=30.0)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--keep", type=Path, help="run in this folder and leave it (logs)")
    parser.add_argument(
        "--gpu", action="store_true", help="name the results for a GPU host (torch uses CUDA)"
    )
    args = parser.parse_args()
    began = time.monotonic()
    sides: dict[str, Any] = {}
    for standby in (False, True):
        rows = measure(
            standby,
            args.interruptions,
            notice_s=args.notice_s,
            step_sleep=args.step_sleep,
            keep=args.keep,
        )
        keys = (
            "last_step_to_first_step_s",
            "exit_to_first_step_s",
            "last_step_to_final_checkpoint_s",
            "final_checkpoint_to_go_s",
            "go_to_first_step_s",
        )
        sides["standby" if standby else "without_standby"] = {
            "handovers": rows,
            **{key: _summary(rows, key) for key in (*keys, "process_before_go_s")},
            "steps_lost": sum(r["steps_lost"] for r in rows),
        }
    wakeups = go_wakeups()
    result = {
        "bench": "standby_gpu" if args.gpu else "standby",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cores": len(os.sched_getaffinity(0)),
        "load_average_1m": round(os.getloadavg()[0], 2),
        **sides,
        "go_wakeup_ms": {
            "each": wakeups,
            "median": round(statistics.median(wakeups), 2),
            "max": max(wakeups),
        },
        "target_on_an_h200_s": TARGET_S,
        "wall_s": round(time.monotonic() - began, 1),
        "command": "python bench/standby.py " + " ".join(sys.argv[1:]),
    }
    out = RESULTS / ("standby_gpu.json" if args.gpu else "standby.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    for side in ("without_standby", "standby"):
        print(f"{side}: last step -> first step {result[side]['last_step_to_first_step_s']}")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
