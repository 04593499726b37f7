"""Managed jobs end to end on the local cloud: a real daemon, real agent processes, real jobs.

The daemon runs in-process on an ephemeral port; every instance is a real process started by
the local cloud from the bootstrap script, running the real agent, which runs the example
training script. Interruptions go through the local metadata endpoint, as on AWS.
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_httpserver import HTTPServer

from optimizer.clock import Clock
from optimizer.daemon.service import Daemon
from optimizer.model import EventKind
from providers.local import LocalCloud
from tests.helpers import TOKEN, api, make_offer, wait_until, write_policy
from tests.helpers.code import ship_files
from tests.helpers.jobs import (
    E2E_FIXTURES,
    POLICY,
    done_summary,
    hook_alerts,
    job_body,
    latest_step,
    running_instance,
    running_instance_id,
    state_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]


clock, cloud, daemon = E2E_FIXTURES


def test_interrupted_twice_the_job_finishes_with_exactly_the_planned_steps(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, httpserver: HTTPServer
) -> None:
    ckpt = tmp_path / "ckpt"
    with api(daemon) as client:
        assert client.post("/jobs", json=job_body("train", ckpt, steps=300)).status_code == 201
    reached = 0
    for attempt in (1, 2):
        instance = wait_until(
            lambda a=attempt: running_instance(cloud, "train", a), 30, f"attempt {attempt} running"
        )
        # let this attempt make progress past a checkpoint before the cloud takes it back
        wanted = reached + 20
        wait_until(lambda n=wanted: latest_step(ckpt) >= n, 60, f"a checkpoint at step {wanted}")
        cloud.interrupt(instance)
        wait_until(lambda i=instance: not running_instance_id(cloud, i), 30, "the power-off")
        reached = latest_step(ckpt)  # what the interrupted attempt saved on its way out
    # (the last attempt imports torch and restores from the bucket first: slow on a loaded host)
    wait_until(lambda: state_of(daemon, "train")["state"] == "succeeded", 120, "the job to finish")

    done = done_summary(ckpt)
    assert done["steps"] == 300
    runs = done["runs"]
    assert len(runs) == 3
    assert [r["restarts"] for r in runs] == ["0", "1", "2"]
    assert runs[0]["from_step"] == 0
    for before, after in itertools.pairwise(runs):
        assert after["from_step"] == before["to_step"] > 0  # resumed from its checkpoint
    job = state_of(daemon, "train")
    assert job["restarts"] == 2

    alerts = wait_until(
        lambda: [a for a in hook_alerts(httpserver) if a.get("kind") == "job.interrupted"] or None,
        10,
        "interruption alerts",
    )
    assert len(alerts) == 2


def test_the_jobs_progress_reaches_the_api_with_a_speed_and_an_eta(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    # The example reports {"step": n, "total": 500} every 5 steps (docs/progress.md); at
    # 0.02 s a step it runs 10 s or more, a speed needs 5 s of reports.
    body = job_body("train", tmp_path / "ckpt", steps=500)
    body["run"] += " --progress-every 5"
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    wait_until(lambda: running_instance(cloud, "train", 1), 30, "the attempt running")

    def measured() -> dict[str, Any] | None:
        found = state_of(daemon, "train")["progress"]
        return found if found and found["eta"] and found["steps_per_hour"] else None

    shown = wait_until(measured, 120, "a speed and an ETA")
    attempt = state_of(daemon, "train")["attempts"][0]
    assert shown["total"] == 500 and 0 < shown["step"] < 500
    assert shown["steps_per_hour"] > 0 and shown["instance_type"] == attempt["instance_type"]
    assert shown["eta"] > shown["at"]
    assert set(shown["by_type"]) == {attempt["instance_type"]}
    wait_until(lambda: state_of(daemon, "train")["state"] == "succeeded", 120, "the job to finish")
    done = state_of(daemon, "train")["progress"]
    assert (done["step"], done["total"], done["fraction_done"]) == (500, 500, 1)
    assert done["eta"] == done["at"]  # done at its last report


def test_capacity_errors_move_the_launch_to_the_next_offer(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    cloud.fail_next("*", "capacity", times=1)  # the first launch, wherever it goes
    with api(daemon) as client:
        body = job_body("cap", tmp_path / "ckpt-cap", steps=10)
        assert client.post("/jobs", json=body).status_code == 201
    wait_until(lambda: state_of(daemon, "cap")["state"] == "succeeded", 60, "the job to finish")
    attempts = daemon.store.jobs.attempts(state_of(daemon, "cap")["id"])
    assert attempts[0].end_reason == "capacity" and attempts[0].instance_id is None
    assert attempts[-1].exit_code == 0
    assert attempts[-1].pool != attempts[0].pool


def test_a_budget_no_offer_meets_keeps_the_job_pending_with_the_reason(
    tmp_path: Path, daemon: Daemon
) -> None:
    write_policy(tmp_path / "policies", "local-eu.yaml", POLICY + "budget: {monthly_usd: 1}\n")
    wait_until(lambda: daemon.registry.get("local-eu").policy.budget.monthly_usd == 1, 10, "reload")
    with api(daemon) as client:
        body = job_body("broke", tmp_path / "ckpt-broke", steps=10)
        assert client.post("/jobs", json=body).status_code == 201
    job = wait_until(
        lambda: (j := state_of(daemon, "broke"))["reason"] and "budget" in j["reason"] and j,
        10,
        "the pending reason",
    )
    assert job["state"] == "pending"
    assert daemon.store.jobs.attempts(job["id"]) == []


def test_a_failed_probe_relaunches_on_another_offer(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    # the local machine has no GPU: a probe that expects one fails, on every offer
    body = job_body(
        "sick", tmp_path / "ckpt-sick", steps=10, probes="quick", expected_gpus=1, max_restarts=1
    )
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    job = wait_until(
        # two quick probes, each a minute or so on a loaded host
        lambda: (j := state_of(daemon, "sick"))["state"] == "failed" and j,
        240,
        "the give-up",
    )
    attempts = daemon.store.jobs.attempts(job["id"])
    assert [a.end_reason for a in attempts] == ["probe_failed", "probe_failed"]
    assert [a.probe_status for a in attempts] == ["fail", "fail"]
    assert attempts[0].pool != attempts[1].pool  # the sick pool was cooled down and avoided
    assert "restart limit 1 reached" in job["reason"]
    assert all(a.exit_code is None for a in attempts)  # the job itself never ran


# The clock starts mid-month (MID_MONTH), so that the rest of the month at any offer's price
# takes the projection past the cap (on the last evening of a month it would not).
def test_projected_monthly_spend_stops_a_launch_past_the_budget(
    tmp_path: Path, daemon: Daemon, clock: Clock
) -> None:
    # $500 already spent this month under the policy: an earlier job ran 10 h at $50/h,
    # ending before the daemon's first poll (no observed price of its pool inside its hours)
    now = clock() - timedelta(hours=1)
    earlier = daemon.store.jobs.add_job("earlier", "local-eu", {"run": "x", "checkpoint_dir": "/x"})
    # Ended at once: the running daemon must not launch it (a pending job is its to launch,
    # and a run of it would add to the month's spend).
    assert daemon.store.jobs.transition_job(
        earlier, expected="pending", state="cancelled", reason="cancelled by request", at=now
    )
    offer = make_offer(
        provider="local",
        region="eu-west-1",
        zone="eu-west-1-a",
        usd_per_hour=50.0,
        observed_at=now,
    )
    daemon.store.jobs.create_attempt(earlier, 1, "earlier-1", offer, "x", now - timedelta(hours=10))
    daemon.store.jobs.update_attempt(
        "earlier-1", instance_id="i-gone", ended_at=now, instance_gone=True, state="ended"
    )
    # a cap every offer passes on its own (price x 730 h), but not on top of what was spent
    write_policy(tmp_path / "policies", "local-eu.yaml", POLICY + "budget: {monthly_usd: 501}\n")
    wait_until(
        lambda: daemon.registry.get("local-eu").policy.budget.monthly_usd == 501, 10, "reload"
    )
    with api(daemon) as client:
        body = job_body("late", tmp_path / "ckpt-late", steps=10)
        assert client.post("/jobs", json=body).status_code == 201
    job = wait_until(
        lambda: (j := state_of(daemon, "late"))["reason"] and "budget:" in j["reason"] and j,
        10,
        "the budget reason",
    )
    assert job["state"] == "pending" and "$500.00 spent this month" in job["reason"]
    assert daemon.store.jobs.attempts(job["id"]) == []


def test_an_auth_error_disables_the_provider_with_an_alert(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    cloud.fail_next("*", "auth", times=1)
    with api(daemon) as client:
        assert client.post("/jobs", json=job_body("denied", tmp_path / "c", 10)).status_code == 201
    job = wait_until(
        lambda: (j := state_of(daemon, "denied"))["state"] == "pending" and j["reason"] and j,
        10,
        "the pending reason",
    )
    assert "failed to launch" in job["reason"]
    attempts = daemon.store.jobs.attempts(job["id"])
    events = daemon.store.events.recent(job_id=job["id"])
    seen = [(e.kind, e.message) for e in events], [(a.key, a.end_reason) for a in attempts]
    assert "provider.auth_failed" in [e.kind for e in events], seen
    assert [a.end_reason for a in attempts] == ["auth"], seen  # one try, then local sat out


def test_a_secret_in_the_daemons_environment_never_reaches_the_agent_or_the_job(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    # set after the daemon started: the local cloud reads the environment at each launch
    secrets = {
        "SLACK_WEBHOOK_URL": "https://hooks.example/leaked-slack",
        "WEBHOOK_SECRET": "leaked-webhook-secret",
        "DATABASE_URL": "postgresql://admin:leaked-db-password@db/gpuopt",
        "AWS_SECRET_ACCESS_KEY": "leaked-aws-key",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "job-env.txt"
    body = job_body("envdump", tmp_path / "ckpt", steps=1)
    body["run"] = f"env > {out}.part && mv {out}.part {out} && sleep 60"
    body["env"] = {"MY_SETTING": "from-the-spec"}
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    instance = wait_until(lambda: running_instance(cloud, "envdump", 1), 30, "the instance")
    wait_until(out.exists, 30, "the job's environment dump")
    job_env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    record = next(r for r in cloud.instances() if r.id == instance)
    agent_env = Path(f"/proc/{record.pid}/environ").read_bytes().decode()

    for name, value in secrets.items():
        assert name not in job_env and value not in out.read_text()
        assert value not in agent_env
    assert job_env["MY_SETTING"] == "from-the-spec"
    assert job_env["GPUOPT_JOB"] == "envdump" and job_env["GPUOPT_ATTEMPT"] == "1"
    assert "PATH" in job_env
    # the instance's own home and temporary folder, on its disk
    disk = cloud.state.disk(instance)
    assert (job_env["HOME"], job_env["TMPDIR"]) == (str(disk / "home"), str(disk / "tmp"))
    assert job_env["GPUOPT_LOCAL_INSTANCE"] == record.mark  # power-off still reaches the job
    # the agent's own settings and token stay with the agent
    assert not {"GPUOPT_AGENT_TOKEN", "GPUOPT_DAEMON_URL", "GPUOPT_ATTEMPT_KEY"} & set(job_env)


SLOW_CHECKPOINT_JOB = """\
import json, os, signal, sys, time
ckpt = os.environ["GPUOPT_CHECKPOINT_DIR"]
state = os.path.join(ckpt, "state.json")
resumed = os.path.exists(state)
n = json.load(open(state))["n"] if resumed else 0
# The first run is slow enough to be interrupted however loaded the host; a resumed one
# hurries through what is left.
pause = 0.002 if resumed else 0.02
log = open(os.path.join(ckpt, "runs.log"), "a")
def line(*words):
    log.write(" ".join(str(w) for w in (time.monotonic(), *words)) + "\\n")
    log.flush()
def save():
    with open(state + ".tmp", "w") as f:
        json.dump({"n": n}, f)
    os.replace(state + ".tmp", state)
def term(*_):
    line("term", n)
    time.sleep(float(sys.argv[2]))  # a checkpoint that takes a while to write
    save()
    line("exit", n)
    sys.exit(143)
line("start", n)
signal.signal(signal.SIGTERM, term)
while n < int(sys.argv[1]):
    time.sleep(pause)
    n += 1
save()
line("exit", n)
"""


def runs_of(ckpt: Path) -> list[tuple[float, float, int, int]]:
    """(start time, exit time, step it started from, step it saved) of each run; the times on
    the host's monotonic clock (one for every process here), as the test's `time.monotonic`."""
    runs: list[tuple[float, float, int, int]] = []
    start: tuple[float, int] | None = None
    for raw in (ckpt / "runs.log").read_text().splitlines():
        at, what, step = raw.split()
        if what == "start":
            assert start is None, f"a run started while another ran: {raw}"
            start = (float(at), int(step))
        elif what == "exit":
            assert start is not None
            runs.append((start[0], float(at), start[1], int(step)))
            start = None
    return runs


def test_a_slow_checkpoint_is_written_before_the_replacement_starts(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    ckpt = tmp_path / "ckpt"
    # A shared checkpoint_dir: the test reads the log the job writes there as it runs.
    code = ship_files(daemon, tmp_path / "job-code", {"slow_job.py": SLOW_CHECKPOINT_JOB})
    body = job_body("slow", ckpt, steps=1, code=code, checkpoint_dir=str(ckpt))
    body["run"] = "python slow_job.py 3000 3"
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    instance = wait_until(lambda: running_instance(cloud, "slow", 1), 30, "attempt 1 running")
    wait_until(lambda: (ckpt / "runs.log").exists() or None, 30, "the job to start")
    # a power-off far off: the old job runs on until the replacement is ready, then gets
    # SIGTERM (a hot handover), and takes 3 s to checkpoint
    interrupted = time.monotonic()  # the power-off comes 60 s after this, or later
    record = cloud.interrupt(instance, grace_s=60)
    assert record.interruption is not None
    wait_until(lambda: state_of(daemon, "slow")["state"] == "succeeded", 90, "the job to finish")

    runs = runs_of(ckpt)
    assert len(runs) == 2
    (start1, exit1, from1, saved1), (start2, _exit2, from2, saved2) = runs
    assert from1 == 0 and saved1 > 0
    assert exit1 < interrupted + 60 - 30  # stopped for the replacement, not the end
    assert exit1 - start1 >= 3  # it did take its time to checkpoint
    assert start2 > exit1  # the replacement started only after the old run exited
    assert from2 == saved1  # and resumed from that checkpoint: nothing lost
    assert saved2 == 3000


def test_a_notice_shorter_than_the_replacement_still_lets_the_old_job_checkpoint(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    ckpt = tmp_path / "ckpt"
    # A shared checkpoint_dir: the test reads the log the job writes there as it runs.
    code = ship_files(daemon, tmp_path / "job-code", {"slow_job.py": SLOW_CHECKPOINT_JOB})
    body = job_body(
        "short", ckpt, steps=1, code=code, checkpoint_dir=str(ckpt), checkpoint_allowance_s=6
    )
    body["run"] = "python slow_job.py 1500 1"
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    instance = wait_until(lambda: running_instance(cloud, "short", 1), 30, "attempt 1 running")
    wait_until(lambda: (ckpt / "runs.log").exists() or None, 30, "the job to start")
    # 6 s to the power-off: within the job's allowance at once, so the daemon stops the old
    # job as soon as it hears of the notice, before any replacement could be ready
    interrupted = time.monotonic()  # the power-off comes 6 s after this, or later
    record = cloud.interrupt(instance, grace_s=6)
    assert record.interruption is not None
    wait_until(lambda: state_of(daemon, "short")["state"] == "succeeded", 90, "the job to finish")

    (_, exit1, _, saved1), (start2, _, from2, saved2) = runs_of(ckpt)
    assert exit1 < interrupted + 6  # checkpointed before the power-off
    assert start2 > exit1 and from2 == saved1 > 0 and saved2 == 1500


# A job whose checkpoint outlasts the notice: on SIGTERM it writes a stamp every 20 ms while it
# "saves" for far longer than the power-off is away, so the power-off kills it mid-save.
STAMPING_JOB = """\
import os, signal, sys, time
ckpt = os.environ["GPUOPT_CHECKPOINT_DIR"]
log = open(os.path.join(ckpt, "stamps.log"), "a")
me = str(os.getpid())
def line(what):
    log.write(f"{me} {time.monotonic()} {what}\\n")
    log.flush()
def term(*_):
    while True:  # a checkpoint that never finishes before the power-off
        line("saving")
        time.sleep(0.02)
line("start")
signal.signal(signal.SIGTERM, term)
for _ in range(int(sys.argv[1])):
    line("step")
    time.sleep(0.02)
line("exit")
"""


def test_an_old_job_still_checkpointing_at_the_power_off_never_overlaps_its_replacement(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, clock: Clock
) -> None:
    """The fence lifts when the old instance is seen gone, not at the announced power-off
    (a cloud's is approximate, and AWS gives it in whole seconds, up to a second early)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # A shared checkpoint_dir: the test reads the log the job writes there as it runs.
    code = ship_files(daemon, tmp_path / "job-code", {"stamping_job.py": STAMPING_JOB})
    body = job_body("stamps", ckpt, steps=1, code=code, checkpoint_dir=str(ckpt))
    body["run"] = "python stamping_job.py 400"
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    instance = wait_until(lambda: running_instance(cloud, "stamps", 1), 30, "attempt 1 running")
    wait_until(lambda: (ckpt / "stamps.log").exists() or None, 30, "the job to start")
    # The power-off 0.9 s past a whole second, ~6 s away (time for the replacement to be
    # ready and fenced): where a notice gives whole seconds, its time says 0.9 s earlier.
    now = clock().timestamp()
    grace = int(now) + 6.9 - now
    assert cloud.interrupt(instance, grace_s=grace).interruption is not None
    wait_until(lambda: state_of(daemon, "stamps")["state"] == "succeeded", 90, "the job to finish")

    runs: dict[str, list[tuple[float, str]]] = {}
    for raw in (ckpt / "stamps.log").read_text().splitlines():
        pid, at, what = raw.split()
        runs.setdefault(pid, []).append((float(at), what))
    assert len(runs) == 2, {pid: stamps[-1] for pid, stamps in runs.items()}
    old, new = sorted(runs.values(), key=lambda stamps: stamps[0][0])
    assert old[-1][1] == "saving"  # the power-off cut its checkpoint short: no job_exited
    assert new[0][1] == "start" and new[-1][1] == "exit"
    assert new[0][0] > old[-1][0]  # the replacement started after the old run's last write
    job_id = state_of(daemon, "stamps")["id"]
    assert daemon.store.events.list_events(kind=EventKind.JOB_FENCE_LIFTED, job_id=job_id) == []


def test_an_interrupted_spot_instance_is_ended_by_the_cloud_at_its_power_off(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    """Launched seconds ago, the interrupted instance's own end is free (AWS's first hour,
    which the local cloud plays): the daemon stops the old job but leaves the instance for
    the cloud to power off at the notice's time, and records the cloud's own times."""
    ckpt = tmp_path / "ckpt"
    with api(daemon) as client:
        assert client.post("/jobs", json=job_body("reclaim", ckpt, steps=400)).status_code == 201
    instance = wait_until(lambda: running_instance(cloud, "reclaim", 1), 30, "attempt 1 running")
    wait_until(lambda: latest_step(ckpt) >= 10, 60, "a first checkpoint in the bucket")
    notice = cloud.interrupt(instance, grace_s=15).interruption
    assert notice is not None
    job_id = state_of(daemon, "reclaim")["id"]

    def first() -> Any:
        return daemon.store.jobs.attempts(job_id)[0]

    # the old job checkpoints, its agent uploads that checkpoint and it exits at once (15 s
    # is within its allowance of 20 s) ...
    wait_until(lambda: first().exit_code is not None, 30, "the old job to exit")
    # ... and its instance stays up, left to the cloud, until the power-off
    ended = wait_until(
        lambda: next((r for r in cloud.instances() if r.id == instance and r.ended), None),
        30,
        "the power-off",
    )
    assert ended.end_reason == "preempted" and ended.stop_requested_at is None  # not gpuopt's
    assert ended.terminated_at == notice.kill_at
    old = wait_until(lambda: (a := first()).instance_gone and a, 10, "the end recorded")
    assert old.terminated_by == "cloud" and old.preempted
    assert old.launched_at == datetime.fromtimestamp(ended.launched_at, UTC)
    assert old.terminated_at == datetime.fromtimestamp(notice.kill_at, UTC)
    left = daemon.store.events.list_events(kind=EventKind.JOB_INSTANCE_LEFT_TO_CLOUD, job_id=job_id)
    assert len(left) == 1 and left[0].data is not None and left[0].data["attempt_key"] == old.key

    wait_until(lambda: state_of(daemon, "reclaim")["state"] == "succeeded", 60, "the job")
    last = wait_until(
        lambda: (a := daemon.store.jobs.attempts(job_id)[-1]).instance_gone and a, 30, "the end"
    )
    own = next(r for r in cloud.instances() if r.id == last.instance_id)
    assert (last.terminated_by, own.end_reason) == ("gpuopt", "user")  # done: gpuopt ends it
    assert last.launched_at == datetime.fromtimestamp(own.launched_at, UTC)
    assert own.terminated_at is not None
    assert last.terminated_at == datetime.fromtimestamp(own.terminated_at, UTC)
    assert last.disk_gib == old.disk_gib == 200


def test_a_failing_setup_is_said_as_such_with_its_last_stderr_line(
    tmp_path: Path, daemon: Daemon, httpserver: HTTPServer
) -> None:
    """Not "job exited 1": the state reason, the alert and the console say the setup failed,
    and quote the last line it wrote to stderr."""
    error = "ERROR: No matching distribution found for nosuchpkg"
    setup = f"echo collecting nosuchpkg; echo '{error}' >&2; exit 1"
    with api(daemon) as client:
        body = job_body("nosetup", tmp_path / "ckpt-nosetup", steps=10, setup=setup)
        assert client.post("/jobs", json=body).status_code == 201
    job = wait_until(
        lambda: (j := state_of(daemon, "nosetup"))["state"] == "failed" and j, 60, "the failure"
    )
    said = f"setup exited 1: {error}"
    assert job["reason"] == said
    alerts = wait_until(
        lambda: [a for a in hook_alerts(httpserver) if a.get("kind") == "job.failed"],
        10,
        "the alert",
    )
    assert said in alerts[0]["message"]
    with httpx.Client(base_url=daemon.url, timeout=30) as page:
        assert page.post("/ui/login", data={"token": TOKEN}).status_code == 303
        html = page.get("/ui/jobs/nosetup").text
    assert f'<span id="job-reason">{said}</span>' in html
