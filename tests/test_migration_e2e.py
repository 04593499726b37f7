"""Moving running jobs end to end on the local cloud: a real daemon polling the local cloud's
prices every 2 s, real agent processes running the example training job, prices and capacity
played with `LocalCloud.pin_price` / `set_capacity` (what `gpuopt local price` / `capacity`
write), and a clock that starts at a fixed instant and jumps ahead when the test needs half an
hour of price history (tests/helpers/clocks.py).

Cases: (d) offers not cheap enough, or not for long enough, move nothing; (a) a price over the
bid cap moves the job within two polls; (b) an on-demand job returns to spot once capacity is
back, and stays; (c) an office-hours window moves a spot job to on-demand at its start; and a
job that finishes while it is being moved succeeds there and never runs again. The guards
under a burst of price changes across 20 jobs (e) are in tests/test_migration_burst_e2e.py.

The job checkpoints only when told to stop (SIGTERM), so "no lost steps" is exact: the step
the old attempt's job saved on its way out is the step the new attempt's job resumed from.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from optimizer.daemon.service import Daemon
from optimizer.model import EventKind
from optimizer.store.jobs import AttemptRecord
from providers.local import LocalCloud
from tests.helpers import api, make_config, running, wait_until, write_policy
from tests.helpers.clocks import JumpClock
from tests.helpers.jobs import ROOT, e2e_cloud, polls_and_passes

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

START = datetime(2026, 12, 1, 9, 0, 3, tzinfo=UTC)  # early in a 10-minute step of the walk
POLL_S = 2.0  # the spot poll interval
REGION = "eu-central-1"
XL_A, XL_B = "g4dn.xlarge@eu-central-1-a", "g4dn.xlarge@eu-central-1-b"
SPOT_T4 = [
    f"g4dn.{size}@eu-central-1-{z}" for size in ("xlarge", "2xlarge", "4xlarge") for z in "ab"
]

POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: movers
workload: {gpus: 1, gpu_memory_gib: 12, gpu_models: [T4]}
markets: [spot, on_demand]
bid: {max_usd_per_hour: 0.7}
placement: {providers: [local], regions: {allow: [eu-central-1]}}
recovery: {pool_cooldown_minutes: 1}
migration:
  enabled: true
  min_savings: 0.25
  min_stable: 30m
  return_to_spot_after: 2m
  min_runtime: 1m
"""


@pytest.fixture
def clock() -> JumpClock:
    return JumpClock(START)


@pytest.fixture
def cloud(tmp_path: Path, clock: JumpClock) -> Iterator[LocalCloud]:
    with e2e_cloud(tmp_path, clock) as local:
        yield local


@pytest.fixture
def daemon(tmp_path: Path, cloud: LocalCloud, clock: JumpClock) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "movers.yaml", POLICY)
    config = make_config(
        tmp_path,
        policy_dir=tmp_path / "policies",
        providers={
            "local": {"regions": [REGION], "spot_interval_s": POLL_S, "on_demand_interval_s": 3600}
        },
        loops={"reconcile_s": 0.5},
    )
    with running(config, sources={"local": cloud}, clock=clock) as d:
        for poll in d.polls:  # on-demand prices (and spot) before the first job
            poll.run_once()
        yield d


def submit(daemon: Daemon, tmp_path: Path, name: str, policy: str = "movers") -> int:
    """A training job that runs for hours and checkpoints only when stopped."""
    body = {
        "name": name,
        "policy": policy,
        "workdir": str(ROOT),
        "run": (
            f"{sys.executable} examples/train_with_checkpoints.py --engine numpy --steps 10000000 "
            "--checkpoint-every 100000000 --step-sleep 0.01 --log-every 100000"
        ),
        "checkpoint_dir": str(tmp_path / f"ckpt-{name}"),
        "probes": "none",
    }
    with api(daemon) as client:
        created = client.post("/jobs", json=body)
    assert created.status_code == 201, created.text
    return int(created.json()["id"])


def attempts(daemon: Daemon, job_id: int) -> list[AttemptRecord]:
    return daemon.store.jobs.attempts(job_id)


def started(daemon: Daemon, job_id: int, number: int | None = None) -> AttemptRecord | None:
    """The job's newest attempt (or attempt `number`) once its job runs."""
    rows = [a for a in attempts(daemon, job_id) if a.job_started_at is not None]
    rows = [a for a in rows if number is None or a.number == number]
    return rows[-1] if rows else None


def migrations(daemon: Daemon, job_id: int) -> list[Any]:
    return daemon.store.events.list_events(kind=EventKind.JOB_MIGRATED, job_id=job_id)


def passes_after(daemon: Daemon, polls: int) -> None:
    """Wait for `polls` more spot polls, each followed by a reconcile pass."""
    polls_and_passes(daemon, polls, POLL_S)


def log_of(daemon: Daemon, name: str, attempt: int) -> str:
    with api(daemon) as client:
        answer = client.get(f"/jobs/{name}/logs", params={"attempt": attempt})
    assert answer.status_code == 200, answer.text
    return answer.text


def test_a_job_stays_for_offers_not_cheap_enough_or_not_for_long_and_leaves_a_pool_over_the_cap(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, clock: JumpClock
) -> None:
    cloud.pin_price(XL_A, 0.15)  # the cheapest there is: every other pool walks above 0.19
    for poll in daemon.polls:
        poll.run_once()
    job_id = submit(daemon, tmp_path, "train")
    first = wait_until(lambda: started(daemon, job_id, 1), 60, "attempt 1 running")
    assert first.pool == ("local", REGION, "eu-central-1-a", "g4dn.xlarge", "spot")

    # (d) 17% cheaper for over half an hour: not by min_savings (25%)
    cloud.pin_price(XL_B, 0.125)
    passes_after(daemon, 1)
    clock.skip(minutes=31)
    passes_after(daemon, 2)
    # … and 67% cheaper, but only just now: not for min_stable (30 min)
    cloud.pin_price("g4dn.2xlarge@eu-central-1-b", 0.05)
    passes_after(daemon, 2)
    assert migrations(daemon, job_id) == []
    assert [a.number for a in attempts(daemon, job_id)] == [1]

    # (a) its own pool's price goes over the cap (0.7): moved within two polls
    pinned_at = clock()
    cloud.pin_price(XL_A, 2.0)
    [event] = wait_until(lambda: migrations(daemon, job_id), 30, "the job.migrated event")
    assert event.at - pinned_at <= timedelta(seconds=2 * POLL_S)
    assert event.data["reason"] == "bid_cap" and event.severity == "warning"
    assert event.data["from_pool"] == "local/eu-central-1/eu-central-1-a/g4dn.xlarge/spot"
    assert event.data["to_pool"] == "local/eu-central-1/eu-central-1-b/g4dn.2xlarge/spot"
    assert event.data["from_usd_per_hour"] == 2.0 and event.data["to_usd_per_hour"] == 0.05
    assert "is above the policy's bid cap (bid.max_usd_per_hour)" in event.message

    # the new attempt's job starts only once the old one has checkpointed and exited
    second = wait_until(lambda: started(daemon, job_id, 2), 90, "attempt 2 running")
    old = attempts(daemon, job_id)[0]
    assert old.end_reason == "migrated" and old.exit_code == 143
    assert old.stop_sent_at is not None and second.job_started_at is not None
    [exited] = [e for e in daemon.store.jobs.agent_events(old.key) if e["kind"] == "job_exited"]
    assert second.job_started_at >= exited["at"]  # both on the agents' (one host's) clock
    saved = re.search(r"signal 15: stopped at step (\d+)/", log_of(daemon, "train", 1))
    assert saved is not None and int(saved.group(1)) > 0
    resumed = wait_until(
        lambda: re.search(r"resumed from step (\d+) ", log_of(daemon, "train", 2)),
        60,
        "attempt 2's first line",
    )
    assert resumed.group(1) == saved.group(1)  # no step lost, none taken twice
    wait_until(lambda: attempts(daemon, job_id)[0].instance_gone, 30, "the old instance to go")
    assert daemon.store.jobs.get_job("train").restarts == 1  # type: ignore[union-attr]


def test_a_job_on_on_demand_returns_to_spot_once_capacity_is_back_and_stays(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, clock: JumpClock
) -> None:
    for pool in SPOT_T4:
        cloud.set_capacity(pool, available=False)
    job_id = submit(daemon, tmp_path, "od")
    first = wait_until(lambda: started(daemon, job_id), 60, "the job running")
    assert first.market == "on_demand"
    assert all(a.end_reason == "capacity" for a in attempts(daemon, job_id)[:-1])

    cloud.pin_price(XL_A, 0.15)  # spot comes back in one zone, the cheapest pool there is
    cloud.set_capacity(XL_A, available=True)
    passes_after(daemon, 2)
    assert migrations(daemon, job_id) == []  # cooling down, then not yet 2 minutes available
    clock.skip(minutes=4)
    [event] = wait_until(lambda: migrations(daemon, job_id), 30, "the move back to spot")
    assert event.data["reason"] == "return_to_spot" and event.severity == "info"
    assert event.data["to_pool"] == "local/eu-central-1/eu-central-1-a/g4dn.xlarge/spot"
    assert "has been available for at least 2 min" in event.message
    back = wait_until(
        lambda: (a := started(daemon, job_id)) and a.market == "spot" and a, 90, "back on spot"
    )
    wait_until(lambda: attempts(daemon, job_id)[first.number - 1].instance_gone, 30, "od gone")

    # stable: an hour later, after many polls, still there and nothing else moved
    clock.skip(minutes=61)
    passes_after(daemon, 4)
    assert len(migrations(daemon, job_id)) == 1
    assert started(daemon, job_id).key == back.key  # type: ignore[union-attr]
    assert daemon.store.jobs.get_job("od").state == "running"  # type: ignore[union-attr]


OFFICE = POLICY.replace("name: movers", "name: office") + (
    "schedule:\n"
    "  timezone: Europe/Berlin\n"
    "  windows:\n"
    '    - {name: office-hours, days: [mon, tue, wed, thu, fri], hours: "10:30-18:00",'
    " markets: [on_demand]}\n"
)


def test_an_office_hours_window_moves_a_spot_job_to_on_demand_at_its_start(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, clock: JumpClock
) -> None:
    write_policy(tmp_path / "policies", "office.yaml", OFFICE)
    wait_until(lambda: daemon.registry.get("office"), 10, "the office policy loaded")
    cloud.pin_price(XL_A, 0.15)
    for poll in daemon.polls:
        poll.run_once()
    job_id = submit(daemon, tmp_path, "desk", policy="office")
    first = wait_until(lambda: started(daemon, job_id, 1), 60, "attempt 1 running")
    assert first.market == "spot"  # Tue 10:00 in Berlin: before office hours
    passes_after(daemon, 1)
    assert migrations(daemon, job_id) == []

    boundary = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)  # 10:30 in Berlin
    clock.skip(seconds=(boundary - clock()).total_seconds())
    [event] = wait_until(lambda: migrations(daemon, job_id), 30, "the move at the boundary")
    assert boundary <= event.at <= boundary + timedelta(seconds=2 * POLL_S)
    assert event.data["reason"] == "not_allowed"
    assert "the policy in force during window office-hours no longer allows" in event.message
    # (the attempt records the zone its on-demand instance landed in)
    assert event.data["to_pool"] == "local/eu-central-1/eu-central-1-a/g4dn.xlarge/on_demand"
    second = wait_until(lambda: started(daemon, job_id, 2), 90, "attempt 2 running")
    assert second.market == "on_demand"
    assert attempts(daemon, job_id)[0].exit_code == 143  # checkpointed on its way out


# Counts nothing: runs until the file $FINISH exists (exit 0), or until SIGTERM (exit 143).
FINISHING_JOB = """\
import os, signal, sys, time
stopping = False

def on_term(signum, frame):
    global stopping
    stopping = True

signal.signal(signal.SIGTERM, on_term)
print("start", os.environ["GPUOPT_ATTEMPT"], flush=True)
while not stopping and not os.path.exists(os.environ["FINISH"]):
    time.sleep(0.05)
print("stopped" if stopping else "done", flush=True)
sys.exit(143 if stopping else 0)
"""


def test_a_job_that_finishes_while_it_is_being_moved_succeeds_and_never_runs_again(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, clock: JumpClock
) -> None:
    script, finish = tmp_path / "finishing.py", tmp_path / "finish"
    script.write_text(FINISHING_JOB)
    cloud.pin_price(XL_A, 0.15)
    for poll in daemon.polls:
        poll.run_once()
    body = {
        "name": "ends",
        "policy": "movers",
        "run": f"{sys.executable} {script}",
        "env": {"FINISH": str(finish)},
        "checkpoint_dir": str(tmp_path / "ckpt-ends"),
        "probes": "none",
    }
    with api(daemon) as client:
        created = client.post("/jobs", json=body)
    assert created.status_code == 201, created.text
    job_id = int(created.json()["id"])
    wait_until(lambda: started(daemon, job_id, 1), 60, "attempt 1 running")
    clock.skip(minutes=2)  # past min_runtime

    # Its pool goes over the cap: it moves, and the new instance's launch is throttled for a
    # while (it keeps its key), so the old job, running on meanwhile, finishes first.
    cloud.fail_next("*", "throttled", times=8)
    cloud.pin_price(XL_A, 2.0)
    wait_until(lambda: migrations(daemon, job_id), 30, "the move")
    finish.touch()
    wait_until(
        lambda: daemon.store.jobs.get_job("ends").state == "succeeded",  # type: ignore[union-attr]
        60,
        "the job to succeed",
        interval=0.05,
    )
    old, new = attempts(daemon, job_id)
    assert old.end_reason == "migrated" and old.exit_code == 0 and old.stop_sent_at is None
    assert "done" in log_of(daemon, "ends", 1)
    # its replacement was ended without starting the job: it ran once, to its end
    assert new.end_reason == "finished_earlier" and new.job_started_at is None
    wait_until(lambda: attempts(daemon, job_id)[1].instance_gone, 30, "the new instance to go")
    [done] = daemon.store.events.list_events(kind=EventKind.JOB_SUCCEEDED, job_id=job_id)
    assert done.message == "job ends finished on attempt 1, before its replacement started it"
    assert daemon.store.jobs.get_job("ends").restarts == 1  # type: ignore[union-attr]
