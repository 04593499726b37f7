"""Notice -> replacement job started, with and without a warm spare, on the local cloud.

A real daemon (in this process) on the local cloud (real instance processes running the real
agent, which runs examples/train_with_checkpoints.py with the numpy engine and the quick
probe) runs one job per mode: `cold` (a plain job: the replacement is launched, boots,
registers and probes after the notice) and `warm` (`warm_spare: true`: the spare, booted and
probed before the notice, takes the job over). Each round waits for the job to run (and, warm,
for a probed spare), posts an interruption notice on the running instance and measures from
the daemon's store:

- notice -> replacement job started: the old attempt's `notice_at` to the new attempt's
  `job_started_at` (the agents' own report times);
- old job's exit -> new job's start: the old job's `job_exited` report to the same start;
- launched after the notice: whether the replacement's instance was launched after it.

The local cloud boots an instance in well under a second and its quick probe is simulated, so
the `cold` figure here is far below a real cloud's (where image, boot, agent install and a
real probe take tens of seconds); the difference between the modes is the part a spare
removes. On a GPU host, run the same with `--probes quick` on real hardware (the local cloud
runs agents on this host). Writes bench/results/warm_spare.json (kept from an H200 host as
warm_spare_h200.json).

    python bench/warm_spare.py [--rounds 3] [--probes quick|none]
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.warm_spare", *sys.argv[1:]])

from optimizer.daemon.service import Daemon  # noqa: E402
from optimizer.store.jobs import AttemptRecord  # noqa: E402
from tests.helpers.cloud import local_cloud  # noqa: E402
from tests.helpers.code import ship  # noqa: E402
from tests.helpers.daemon import api, make_config, running  # noqa: E402
from tests.helpers.jobs import POLICY, job_body  # noqa: E402
from tests.helpers.policies import write_policy  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "warm_spare.json"


def _rows(daemon: Daemon, job_id: int) -> list[AttemptRecord]:
    return daemon.store.jobs.attempts(job_id)


def _exited_at(daemon: Daemon, key: str) -> float | None:
    for event in daemon.store.jobs.agent_events(key):
        if event["kind"] == "job_exited":
            return float(event["at"].timestamp())
    return None


def _spare_ready(attempt: AttemptRecord, probes: str) -> bool:
    """A spare is ready once probed (pass or warn), or registered where no probe runs."""
    if probes == "none":
        return attempt.registered_at is not None
    return attempt.probe_status in ("pass", "warn")


def one_mode(folder: Path, mode: str, rounds: int, probes: str) -> list[dict[str, Any]]:
    """`rounds` interruptions of one job in `mode` (cold | warm); one figure dict each."""
    for name in list(os.environ):
        if name.startswith("GPUOPT_") and name != "GPUOPT_SHARED_DIR":
            del os.environ[name]
    write_policy(folder / "policies", "local-eu.yaml", POLICY)
    config = make_config(folder, policy_dir=folder / "policies", loops={"reconcile_s": 0.25})
    out: list[dict[str, Any]] = []
    with (
        local_cloud(folder / "cloud", grace_s=30, terminate_grace_s=2.0, tick_s=0.05) as cloud,
        running(config, sources={"local": cloud}) as daemon,
    ):
        for poll in daemon.polls:
            poll.run_once()
        ship(daemon)
        extra: dict[str, Any] = {"probes": probes, "warm_spare": mode == "warm"}
        body = job_body("bench", folder / "ckpt", steps=10_000_000, **extra)
        with api(daemon) as client:
            assert client.post("/jobs", json=body).status_code == 201
            job_id = int(client.get("/jobs/bench").json()["id"])
        for n in range(rounds):
            current = wait_until(
                lambda: next(
                    (a for a in _rows(daemon, job_id) if a.job_started_at and not a.ended), None
                ),
                300,
                "the job running",
            )
            if mode == "warm":
                wait_until(
                    lambda: any(
                        a.idle_spare and not a.ended and _spare_ready(a, probes)
                        for a in _rows(daemon, job_id)
                    ),
                    300,
                    "a ready spare",
                )
            time.sleep(2.0)  # let the job make steps before the notice
            cloud.interrupt(current.instance_id or "")
            new = wait_until(
                lambda c=current: next(
                    (
                        a
                        for a in _rows(daemon, job_id)
                        if a.number > c.number and a.job_started_at and not a.idle_spare
                    ),
                    None,
                ),
                300,
                f"round {n + 1}: the replacement running",
            )
            old = daemon.store.jobs.attempt(current.key) or current
            assert old.notice_at is not None and new.job_started_at is not None
            exited = _exited_at(daemon, old.key)
            started = new.job_started_at.timestamp()
            out.append(
                {
                    "mode": mode,
                    "round": n + 1,
                    "notice_to_replacement_started_s": started - old.notice_at.timestamp(),
                    "old_exit_to_new_start_s": None if exited is None else started - exited,
                    "launched_after_notice": new.started_at > old.notice_at,
                    "promoted_spare": new.promoted_at is not None,
                }
            )
            print(json.dumps(out[-1]), flush=True)
        with api(daemon) as client:
            client.post("/jobs/bench/cancel")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probes", choices=("quick", "none"), default="quick")
    args = parser.parse_args()
    rounds: list[dict[str, Any]] = []
    for mode in ("cold", "warm"):
        with tempfile.TemporaryDirectory(prefix=f"gpuopt-bench-spare-{mode}-") as tmp:
            rounds += one_mode(Path(tmp), mode, args.rounds, args.probes)

    def median(mode: str, key: str) -> float | None:
        values = [r[key] for r in rounds if r["mode"] == mode and r[key] is not None]
        return statistics.median(values) if values else None

    result = {
        "bench": "warm_spare",
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "probes": args.probes,
        "rounds": rounds,
        "median": {
            mode: {
                "notice_to_replacement_started_s": median(mode, "notice_to_replacement_started_s"),
                "old_exit_to_new_start_s": median(mode, "old_exit_to_new_start_s"),
            }
            for mode in ("cold", "warm")
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
