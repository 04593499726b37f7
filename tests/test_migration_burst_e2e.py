"""Moving running jobs under a burst of price changes, end to end: 20 jobs of one policy
(migration enabled, `disruption_budget: 2`, `max_per_day: 1`) on the local cloud, and the
store's record of every move afterwards.

Real: the daemon (its poll and reconcile loops, the migration pass, the API, a SQLite store),
the local cloud (its prices, with pools pinned through `LocalCloud.pin_price`, what `gpuopt
local price` writes), one instance process per attempt running the real agent over HTTP, and
each job as a process that checkpoints when the agent sends it SIGTERM. Not real: the job is
a small counting script (tests/helpers/agent.py) rather than the torch example, and the agents'
metadata and telemetry polls are slowed (no notice and no GPU reading comes here), so that 30
attempts' agents and jobs fit on a CI runner; and the calendar, which is a JumpClock starting
at a fixed instant and skipping a day ahead when the test needs the next day
(tests/helpers/clocks.py).

The burst, over several polls: the pool all 20 jobs run in goes over the bid cap (every job
wants to move at once), then the pool the first movers reached goes over the cap too while
another one turns cheap, then the first pool comes back under the cap.
Proved from the events and attempts: never more than 2 of the policy's jobs between leaving
their attempt and running again; no job moved twice within 24 hours (those the second price
rise caught stay on a pool over the cap until the day has passed, then move); and every job
kept running, each move resuming at the very step its old attempt checkpointed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from optimizer.daemon.service import Daemon
from optimizer.model import EventKind
from optimizer.store import EventRecord
from providers.local import LocalCloud
from tests.helpers import api, make_config, running, wait_until, write_policy
from tests.helpers.agent import counter_job
from tests.helpers.clocks import JumpClock
from tests.helpers.jobs import e2e_cloud, polls_and_passes

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

START = datetime(2026, 12, 1, 9, 0, 3, tzinfo=UTC)
POLL_S = 1.0  # the spot poll interval
JOBS = 20
BUDGET = 2
A, B, C = "g4dn.xlarge@eu-central-1-a", "g4dn.xlarge@eu-central-1-b", "g4dn.2xlarge@eu-central-1-b"
POOL_B = "local/eu-central-1/eu-central-1-b/g4dn.xlarge/spot"  # as events name it

POLICY = f"""\
apiVersion: gpuopt/v1
kind: Policy
name: burst
workload: {{gpus: 1, gpu_memory_gib: 12, gpu_models: [T4]}}
markets: [spot]
bid: {{max_usd_per_hour: 0.7}}
placement: {{providers: [local], regions: {{allow: [eu-central-1]}}}}
migration:
  enabled: true
  min_savings: 0.25
  min_stable: 30m
  max_per_day: 1
  min_runtime: 0s
  disruption_budget: {BUDGET}
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
    write_policy(tmp_path / "policies", "burst.yaml", POLICY)
    config = make_config(
        tmp_path,
        policy_dir=tmp_path / "policies",
        providers={
            "local": {
                "regions": ["eu-central-1"],
                "spot_interval_s": POLL_S,
                "on_demand_interval_s": 3600,
            }
        },
        loops={"reconcile_s": 0.5, "watch_s": 5, "deliver_s": 1},
        # No interruption notice and no GPU reading comes here: the agents poll for them
        # slowly, as 20 of them share the runner.
        agent={"env": {"GPUOPT_AGENT_POLL_S": "30", "GPUOPT_AGENT_TELEMETRY_S": "60"}},
    )
    with running(config, sources={"local": cloud}, clock=clock) as d:
        yield d


def submit(daemon: Daemon, tmp_path: Path) -> dict[int, str]:
    """JOBS counting jobs (10 steps a second, for days), by id."""
    run = counter_job(tmp_path)
    ids: dict[int, str] = {}
    with api(daemon) as client:
        for n in range(JOBS):
            name = f"burst-{n:02d}"
            created = client.post(
                "/jobs",
                json={
                    "name": name,
                    "policy": "burst",
                    "workdir": str(tmp_path),
                    "run": run,
                    "env": {"TOTAL": "100000000", "STEP_S": "0.1"},
                    "checkpoint_dir": str(tmp_path / f"ckpt-{name}"),
                    "probes": "none",
                },
            )
            assert created.status_code == 201, created.text
            ids[int(created.json()["id"])] = name
    return ids


def events(daemon: Daemon, kind: EventKind) -> list[EventRecord]:
    """Every event of `kind`, oldest first."""
    return sorted(daemon.store.events.list_events(kind=kind, limit=10_000), key=lambda e: e.id)


def migrations(daemon: Daemon) -> list[EventRecord]:
    return events(daemon, EventKind.JOB_MIGRATED)


def settled(daemon: Daemon, ids: dict[int, str]) -> bool:
    """Every job runs on its newest attempt: none is between two attempts."""
    state = {j.id: j.state for j in daemon.store.jobs.list_jobs()}
    rows = daemon.store.jobs.attempts_of(ids)
    for job_id in ids:
        last = rows[job_id][-1] if rows.get(job_id) else None
        if state[job_id] != "running" or last is None or last.ended or not last.job_started_at:
            return False
    return True


def moving_spans(daemon: Daemon) -> list[tuple[int, datetime, datetime]]:
    """(job, from, until) for each move, on the daemon's clock: from its `job.migrated` event
    to the job's next transition to running (what the migration pass counts as moving)."""
    back = [
        e
        for e in events(daemon, EventKind.JOB_STATE_CHANGED)
        if (e.data or {}).get("to") == "running"
    ]
    spans = []
    for move in migrations(daemon):
        until = min(e.at for e in back if e.job_id == move.job_id and e.at > move.at)
        spans.append((int(move.job_id or 0), move.at, until))
    return spans


def most_at_once(spans: list[tuple[int, datetime, datetime]]) -> int:
    """The most spans in progress at one instant (each holds from its start, until its end)."""
    return max(sum(1 for _, s, e in spans if s <= at < e) for _, at, _ in spans)


def step_in_log(daemon: Daemon, name: str, attempt: int, pattern: str) -> int:
    """The step a line of the attempt's output names (`pattern`'s group), once shipped."""

    def found() -> re.Match[str] | None:
        with api(daemon) as client:
            answer = client.get(f"/jobs/{name}/logs", params={"attempt": attempt})
        assert answer.status_code == 200, answer.text
        return re.search(pattern, answer.text, re.M)

    match = wait_until(found, 30, f"{pattern!r} in {name}'s attempt {attempt}", interval=0.1)
    assert match is not None
    return int(match.group(1))


def test_a_burst_of_price_changes_across_20_jobs_keeps_to_the_disruption_budget_and_max_per_day(
    tmp_path: Path,
    daemon: Daemon,
    cloud: LocalCloud,
    clock: JumpClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="optimizer.jobs.reconcile")
    cloud.pin_price(A, 0.15)  # the cheapest pool: every other one walks above 0.19
    for poll in daemon.polls:
        poll.run_once()
    ids = submit(daemon, tmp_path)
    wait_until(lambda: settled(daemon, ids), 120, "all 20 jobs running", interval=0.2)
    firsts = daemon.store.jobs.attempts_of(ids)
    assert {rows[0].pool[2:4] for rows in firsts.values()} == {("eu-central-1-a", "g4dn.xlarge")}

    # The burst. A goes over the cap (0.7), B the best pool left: all 20 want to move at once.
    cloud.pin_price(B, 0.10)
    cloud.pin_price(A, 2.0)
    wait_until(lambda: migrations(daemon), 90, "the first moves", interval=0.1)
    # B goes over the cap too, C is the best now: those on A go on moving, to C; those that
    # reached B have moved once today.
    cloud.pin_price(C, 0.05)
    cloud.pin_price(B, 2.0)
    wait_until(lambda: len(migrations(daemon)) >= 3 * BUDGET, 90, "more moves", interval=0.1)
    # A comes back under the cap, C is no cheaper than A: nothing calls for a move but B.
    cloud.pin_price(A, 0.15)
    cloud.pin_price(C, 0.15)
    polls_and_passes(daemon, 1, POLL_S)
    wait_until(lambda: settled(daemon, ids), 90, "the moves in flight to land", interval=0.2)
    day_one = migrations(daemon)
    on_b = {int(e.job_id or 0) for e in day_one if (e.data or {}).get("to_pool") == POOL_B}
    assert on_b, "some jobs reached B before its price rose"
    assert all((e.data or {}).get("reason") == "bid_cap" for e in day_one)
    assert all((e.data or {}).get("from_pool") != POOL_B for e in day_one)

    # B stays over the cap for more polls, with the budget free: its jobs stay, held back by
    # max_per_day and saying so.
    polls_and_passes(daemon, 2, POLL_S)
    assert [e.id for e in migrations(daemon)] == [e.id for e in day_one]
    rows = daemon.store.jobs.attempts_of(ids)
    assert all(rows[j][-1].pool[2:4] == ("eu-central-1-b", "g4dn.xlarge") for j in on_b)
    for job_id in on_b:
        assert (
            f"job {ids[job_id]}: not moved yet (bid_cap: it moved 1 time(s) in the last 24 h "
            "(max_per_day 1))"
        ) in caplog.text
    assert f"policy burst's disruption budget of {BUDGET} job(s) moving at once is used" in (
        caplog.text
    )

    # The next day: those on B move again (under the budget too), and nothing else does.
    clock.skip(hours=24)
    wait_until(
        lambda: len(migrations(daemon)) == len(day_one) + len(on_b) and settled(daemon, ids),
        90,
        "the jobs on B to move again and run",
        interval=0.2,
    )
    polls_and_passes(daemon, 1, POLL_S)
    moves = migrations(daemon)
    assert len(moves) == len(day_one) + len(on_b)
    assert {int(e.job_id or 0) for e in moves[len(day_one) :]} == on_b

    # At no moment more than the budget moving; at some, the budget full.
    spans = moving_spans(daemon)
    assert most_at_once(spans) == BUDGET
    assert [s for s in spans if not s[1] < s[2]] == []
    # No job moved twice within 24 hours (max_per_day 1).
    times: dict[int, list[datetime]] = {}
    for job_id, at, _ in spans:
        times.setdefault(job_id, []).append(at)
    assert all(b - a >= timedelta(days=1) for ts in times.values() for a, b in pairwise(ts))
    # The attempts agree with the events: one attempt ended `migrated` per move, at its time.
    rows = daemon.store.jobs.attempts_of(ids)
    ended = sorted(
        (a.job_id, a.ended_at) for r in rows.values() for a in r if a.end_reason == "migrated"
    )
    assert ended == sorted((j, at) for j, at, _ in spans)

    # Every job kept running: its attempts ended only to move (each job checkpointed, exit
    # 143), the newest runs, and each move resumed at the step the old attempt saved.
    jobs = {j.id: j for j in daemon.store.jobs.list_jobs()}
    for job_id, name in ids.items():
        attempts = rows[job_id]
        assert jobs[job_id].state == "running"
        assert jobs[job_id].restarts == len(times.get(job_id, ())) == len(attempts) - 1
        assert all(a.end_reason == "migrated" and a.exit_code == 143 for a in attempts[:-1])
        for old, new in pairwise(attempts):
            saved = step_in_log(daemon, name, old.number, r"checkpointed (\d+)")
            assert saved > 0
            resumed = step_in_log(daemon, name, new.number, r"^start (\d+) ")
            assert resumed == saved, f"{name}: steps lost or taken twice"
