"""A job with a deadline end to end on the local cloud, its spot capacity following a trace
(`gpuopt local capacity --trace`): spot while the slack allows, a wait for spot once the trace
takes it away, on-demand once the slack is short (with `job.deadline_at_risk`), and the
deadline met. Real daemon, real agent processes, real training job (tests/helpers/jobs.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from pytest_httpserver import HTTPServer

from optimizer.clock import parse_utc
from optimizer.daemon.service import Daemon
from optimizer.model import EventKind
from providers.local import LocalCloud
from tests.helpers import api, run_gpuopt, wait_until, write_policy
from tests.helpers.daemon import TOKEN
from tests.helpers.jobs import E2E_FIXTURES, POLICY, hook_alerts, job_body, state_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]


clock, cloud, daemon = E2E_FIXTURES

DEADLINE_S = 55  # the job's deadline, after submit
# The work it declares: the job below sleeps 10 s in all, which a loaded host stretches; what
# is declared is an upper bound, as a user's estimate is.
WORK_S = 30
TICK_S = 8  # one hour of the trace lasts this long here
# Twenty half-second steps in one process, each recorded in the folder the attempts share as
# it is done: an attempt carries on from the steps its predecessors recorded.
STEPS = """\
import os, time
done = os.path.join(os.environ["GPUOPT_CHECKPOINT_DIR"], "steps")
n = os.path.getsize(done) if os.path.exists(done) else 0
while n < 20:
    time.sleep(0.5)
    with open(done, "a") as f:
        f.write("x")
    n += 1
"""
# An hourly availability trace in the public format: one spot instance for an hour, then none.
TRACE = {"metadata": {"gap_seconds": 3600}, "data": [1] + [0] * 47}


@pytest.mark.parametrize("name", ["gpuopt", "greedy"])
def test_a_deadline_job_starts_on_spot_then_runs_on_demand_and_meets_its_deadline(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, httpserver: HTTPServer, name: str
) -> None:
    """gpuopt (the default) leaves spot for on-demand once waiting for spot costs more than
    on-demand would; greedy waits for spot until the slack is gone (the at-risk event)."""
    policy = POLICY.replace(
        "on_demand_after_interruptions: 5}",
        f"on_demand_after_interruptions: 5, restart_overhead: 5s, deadline_strategy: {name}}}",
    )
    assert policy != POLICY
    write_policy(tmp_path / "policies", "local-eu.yaml", policy)
    wait_until(
        lambda: daemon.registry.get("local-eu").policy.recovery.restart_overhead == 5,
        10,
        "the policy reload",
    )
    trace = tmp_path / "eu-central-1a_g4dn_1.json"
    trace.write_text(json.dumps(TRACE))
    drill = run_gpuopt(tmp_path, "local", "capacity", "--trace", str(trace), "--tick", str(TICK_S))
    assert drill.returncode == 0, drill.stderr
    # The daemon's cloud starts the trace's clock when it first sees it.
    wait_until(lambda: cloud.state.root.joinpath("market.json").is_file(), 10, "the trace")
    wait_until(
        lambda: all(
            t.get("start") is not None
            for t in json.loads(cloud.state.root.joinpath("market.json").read_text())[
                "traces"
            ].values()
        ),
        10,
        "the trace's clock",
    )

    shared = tmp_path / "shared"
    shared.mkdir()
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    body = job_body(
        "dl",
        tmp_path / "ckpt",
        steps=0,
        run=f"python {script}",
        checkpoint_dir=str(shared),
        deadline=f"{DEADLINE_S}s",
        work=f"{WORK_S}s",
    )
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    job = state_of(daemon, "dl")
    submitted = parse_utc(job["created_at"])
    deadline = submitted + timedelta(seconds=DEADLINE_S)

    done = wait_until(
        lambda: (j := state_of(daemon, "dl"))["state"] in ("succeeded", "failed") and j,
        DEADLINE_S + 30,
        "the job to end",
    )
    attempts = daemon.store.jobs.attempts(job["id"])
    seen = [
        (a.number, a.market, a.end_reason, a.started_at, a.job_started_at, a.ended_at)
        for a in attempts
    ]
    assert done["state"] == "succeeded", (done["reason"], seen)

    assert (shared / "steps").read_text() == "x" * 20  # the work done, carried across attempts

    # Spot while the slack allowed: the first attempt, until the trace took spot away; every
    # launch after it looked for spot (and found none) until the one on-demand.
    assert attempts[0].market == "spot" and attempts[0].end_reason == "preempted", seen
    assert all(a.market == "spot" and a.end_reason == "capacity" for a in attempts[1:-1]), seen
    on_demand = [a for a in attempts if a.market == "on_demand"]
    assert on_demand and attempts[-1].market == "on_demand" and attempts[-1].exit_code == 0, seen
    events = daemon.store.events.list_events(job_id=job["id"], limit=500)
    risks = [e for e in events if e.kind == EventKind.JOB_DEADLINE_AT_RISK]
    if name == "greedy":
        # Then on-demand, only once the deadline was at risk (no on-demand launch before it).
        (risk,) = risks
        assert risk.data is not None and risk.data["decision"] == "on_demand", risk.data
        assert all(a.started_at >= risk.at for a in on_demand), (risk.at, seen)
        # Spot was waited for while the slack allowed: the on-demand launch came well after
        # the interruption (launches in between tried spot only and found no capacity).
        interrupted = attempts[0].ended_at
        assert interrupted is not None
        assert (on_demand[0].started_at - interrupted).total_seconds() > 3
    else:
        # on-demand while there was still slack in hand: never at risk
        assert risks == [], [e.data for e in risks]
    # The deadline met, and said so by the job's view.
    finished = parse_utc(done["updated_at"])
    assert finished <= deadline, (finished, deadline)
    view = state_of(daemon, "dl")["deadline"]
    assert view["at"] == deadline.isoformat() and view["missed"] is False
    assert not [e for e in events if e.kind == EventKind.JOB_DEADLINE_MISSED]
    if name == "gpuopt":
        # The deadline, the work left and the slack, as the job stood when it finished: the
        # same words in `gpuopt jobs show` and on the console's job page.
        shown = run_gpuopt(
            tmp_path, "jobs", "show", "dl", "--api", daemon.url, env={"GPUOPT_API_TOKEN": TOKEN}
        )
        assert shown.returncode == 0, shown.stderr
        [line] = [x.strip() for x in shown.stdout.splitlines() if "deadline:" in x]
        assert line.startswith(f"deadline: {deadline:%Y-%m-%d %H:%M} UTC; work left ")
        assert "slack" in line and "(at risk)" not in line and "(missed)" not in line
        with httpx.Client(base_url=daemon.url, timeout=30) as page:
            assert page.post("/ui/login", data={"token": TOKEN}).status_code == 303
            html = page.get("/ui/jobs/dl").text
        assert f'id="job-deadline">{line.removeprefix("deadline: ")}</dd>' in html
        return
    # The at-risk alert went out like other job events.
    wait_until(
        lambda: any(a.get("kind") == "job.deadline_at_risk" for a in hook_alerts(httpserver)),
        10,
        "the at-risk alert",
    )
