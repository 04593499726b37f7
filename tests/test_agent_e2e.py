"""The agent end to end, as real processes: the local cloud launches an instance whose
bootstrap script starts `gpuopt agent run`, which talks to a fake daemon."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from optimizer.common.procs import proc_start_ticks
from optimizer.jobs.bootstrap import bootstrap_script
from providers.base import EndReason, InstanceState
from providers.local import LocalCloud
from tests.helpers import GPUOPT, gpuopt_env, wait_until
from tests.helpers.agent import (
    AGENT_FIXTURES,
    FAST,
    FakeDaemon,
    counter_job,
    launch_on,
    read_json,
)

cloud, daemon = AGENT_FIXTURES


def launch(
    cloud: LocalCloud,
    daemon: FakeDaemon,
    job: dict[str, Any],
    key: str = "train/1",
    env: dict[str, str] | None = None,
    metadata_kind: str = "aws-imds",
    **answer: Any,
):
    token = secrets.token_urlsafe(32)
    daemon.add_attempt(key, token, job, **answer)
    script = bootstrap_script(
        daemon_url=daemon.url,
        token=token,
        attempt_key=key,
        cloud="local",
        metadata_kind=metadata_kind,
        install=None,
        python=sys.executable,
        env={**FAST, **(env or {})},
    )
    return launch_on(cloud, script, key)


def status(cloud: LocalCloud, ref):
    return cloud.describe([ref])[0]


def console(cloud: LocalCloud, ref) -> str:
    return (cloud.state.disk(ref.instance_id) / "console.log").read_text()


def test_interruption_notice_leads_to_stop_checkpoint_and_acked_events(
    cloud: LocalCloud, daemon: FakeDaemon, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    job = {
        "name": "train",
        "run": counter_job(tmp_path),
        "env": {"TOTAL": "100000", "GREETING": "hello"},
        "checkpoint_dir": str(ckpt),
        "probes": "none",
    }

    # The daemon's side of an interruption: tell the agent to stop the job.
    def react(key: str, event: dict[str, Any]) -> None:
        if event["kind"] == "interruption_notice" and event["data"]["source"] == "aws-imds-spot":
            daemon.command(key, {"kind": "stop", "reason": "interrupted", "grace_s": 10})

    daemon.react = react
    ref = launch(cloud, daemon, job, attempt=3, restarts=2)
    wait_until(lambda: "job_started" in daemon.kinds(), what="job_started")
    wait_until(lambda: (ckpt / "state.json").exists(), what="a first checkpoint")
    registration = daemon.registrations[0]
    assert registration["instance_id"] == ref.instance_id
    assert registration["provider"] == "local"

    notice = cloud.interrupt(ref.instance_id, grace_s=15).interruption
    assert notice is not None
    wait_until(lambda: "interruption_notice" in daemon.kinds(), timeout=5, what="the notice")
    wait_until(lambda: "stopped" in daemon.kinds(), timeout=15, what="stopped")
    exited = daemon.of_kind("job_exited")[0]["data"]
    assert exited["exit_code"] == 143 and exited["stopped"] is True
    # The instance's process (the agent) ends on its own, long before the power-off; the
    # instance stays up, idle, as a VM would, until the cloud powers it off at the notice's
    # time, and reports the end as a preemption.
    agent = cloud.state.load(ref.instance_id)
    assert agent is not None and agent.pid is not None
    wait_until(lambda: proc_start_ticks(agent.pid) is None, timeout=15, what="the agent to exit")
    idle = status(cloud, ref)
    assert (idle.state, idle.end_reason) == (InstanceState.RUNNING, EndReason.PREEMPTED)
    end = wait_until(
        lambda: (s := status(cloud, ref)).state is InstanceState.TERMINATED and s,
        timeout=30,
        what="the power-off",
    )
    assert end.end_reason is EndReason.PREEMPTED
    assert end.terminated_at == datetime.fromtimestamp(notice.kill_at, UTC)

    kinds = daemon.kinds()
    assert kinds.index("job_started") < kinds.index("interruption_notice") < kinds.index("stopped")
    notices = daemon.of_kind("interruption_notice")
    assert {n["data"]["source"] for n in notices} == {"aws-imds-spot", "aws-imds-rebalance"}
    assert len(notices) == 2  # polled many times, reported once each
    spot = next(n for n in notices if n["data"]["source"] == "aws-imds-spot")
    assert spot["data"]["action"] == "terminate" and len(spot["data"]["payload_sha256"]) == 64
    # Nothing is left unacknowledged on the instance's disk.
    saved = read_json(cloud.state.disk(ref.instance_id) / "agent" / "events.json")
    assert saved["events"] == []
    log = (cloud.state.disk(ref.instance_id) / "agent" / "job.log").read_text()
    assert "start 0 3 2 no-token hello" in log  # protocol env, job env, and no token
    step = read_json(ckpt / "state.json")["step"]
    assert f"checkpointed {step}" in log
    # All of the job's output reached the daemon before the agent ended, once.
    assert daemon.output("train/1", "stdout") == log and daemon.log_conflicts == []
    assert exited["log_chunks"] == len(daemon.logs["train/1"])
    assert read_json(cloud.state.disk(ref.instance_id) / "agent" / "logs.json")["pending"] == []


def test_job_runs_to_the_end_and_events_survive_a_daemon_outage(
    cloud: LocalCloud, daemon: FakeDaemon, tmp_path: Path
) -> None:
    daemon.fail_register = 2  # the daemon is not up yet
    daemon.fail_events = 3  # and then drops a few batches
    job = {
        "name": "train",
        "run": counter_job(tmp_path),
        "setup": "echo setting-up",
        "env": {"TOTAL": "10", "STEP_S": "0.01"},
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "probes": "none",
    }
    ref = launch(cloud, daemon, job)
    end = wait_until(
        lambda: (s := status(cloud, ref)).state is InstanceState.TERMINATED and s,
        timeout=30,
        what="the instance to end",
    )
    assert end.end_reason is EndReason.USER, console(cloud, ref)  # exit 0: shut itself down
    kinds = [k for k in daemon.kinds() if k != "heartbeat"]
    assert kinds == ["job_started", "job_exited"]
    assert daemon.of_kind("job_exited")[0]["data"]["exit_code"] == 0
    log = (cloud.state.disk(ref.instance_id) / "agent" / "job.log").read_text()
    assert "setting-up" in log and "done 10" in log


def test_failed_probe_is_reported_and_the_job_never_starts(
    cloud: LocalCloud, daemon: FakeDaemon, tmp_path: Path
) -> None:
    daemon.stop_on_failed_probe()
    job = {
        "name": "train",
        "run": "echo should-not-run",
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "probes": "quick",
        "expected_gpus": 64,  # no machine has that many: the probe fails fast and for sure
    }
    ref = launch(cloud, daemon, job, env={"GPUOPT_PROBE_CPU_N": "64"})
    wait_until(lambda: "stopped" in daemon.kinds(), timeout=40, what="stopped")
    probe = daemon.of_kind("probe_result")[0]["data"]
    assert probe["status"] == "fail"
    assert probe["result"]["schema"] == "gpuopt.probe"
    count = next(c for c in probe["result"]["checks"] if c["name"] == "gpu.count")
    assert count["status"] == "fail"
    assert "job_started" not in daemon.kinds()
    wait_until(
        lambda: status(cloud, ref).state is InstanceState.TERMINATED, timeout=15, what="the end"
    )


def test_the_agent_reads_gcp_shaped_metadata_too(
    cloud: LocalCloud, daemon: FakeDaemon, tmp_path: Path
) -> None:
    def react(key: str, event: dict[str, Any]) -> None:
        if event["kind"] == "interruption_notice":
            daemon.command(key, {"kind": "stop", "reason": "interrupted", "grace_s": 10})

    daemon.react = react
    job = {
        "name": "train",
        "run": counter_job(tmp_path),
        "env": {"TOTAL": "100000"},
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "probes": "none",
    }
    ref = launch(cloud, daemon, job, metadata_kind="gcp-metadata")
    wait_until(lambda: "job_started" in daemon.kinds(), what="job_started")
    cloud.interrupt(ref.instance_id)
    wait_until(lambda: "stopped" in daemon.kinds(), timeout=15, what="stopped")
    notices = daemon.of_kind("interruption_notice")
    assert [(n["data"]["source"], n["data"]["action"]) for n in notices] == [
        ("gcp-metadata-preempted", "preempted")
    ]
    assert daemon.registrations[0]["instance_id"] == ref.instance_id  # from instance/name
    assert daemon.of_kind("job_exited")[0]["data"]["exit_code"] == 143


def test_terminating_the_instance_reaches_the_job_through_the_agent(
    cloud: LocalCloud, daemon: FakeDaemon, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    job = {
        "name": "train",
        "run": counter_job(tmp_path),
        "env": {"TOTAL": "100000"},
        "checkpoint_dir": str(ckpt),
        "probes": "none",
    }
    ref = launch(cloud, daemon, job)
    wait_until(lambda: "job_started" in daemon.kinds(), what="job_started")
    wait_until(lambda: "heartbeat" in daemon.kinds(), what="a heartbeat")
    heartbeat = daemon.of_kind("heartbeat")[0]["data"]
    assert heartbeat["state"] == "running" and heartbeat["job_pid"]
    cloud.terminate(ref)  # SIGTERM to the agent, which forwards it to the job
    end = wait_until(
        lambda: (s := status(cloud, ref)).state is InstanceState.TERMINATED and s,
        timeout=15,
        what="the instance to end",
    )
    assert end.end_reason is EndReason.USER
    exited = daemon.of_kind("job_exited")[0]["data"]
    assert exited["exit_code"] == 143 and exited["stopped"] is False
    assert "stopped" not in daemon.kinds()  # no stop command was given
    log = (cloud.state.disk(ref.instance_id) / "agent" / "job.log").read_text()
    assert f"checkpointed {read_json(ckpt / 'state.json')['step']}" in log


# Prints numbered lines (every seventh also to stderr) until the file named by its argument
# exists, then one last line.
RELEASED_JOB = """
import os, sys, time
i = 0
while not os.path.exists(sys.argv[1]):
    print("line", i, flush=True)
    if i % 7 == 0:
        print("err", i, file=sys.stderr, flush=True)
    i += 1
    time.sleep(0.01)
print("end", i, flush=True)
"""


def test_a_restarted_agent_ships_the_adopted_jobs_output_without_loss_or_copies(
    daemon: FakeDaemon, tmp_path: Path
) -> None:
    script, release = tmp_path / "job.py", tmp_path / "release"
    script.write_text(RELEASED_JOB)
    token, key, agent_dir = secrets.token_urlsafe(32), "train/1", tmp_path / "agent"
    job = {"name": "train", "run": f"{sys.executable} {script} {release}", "probes": "none",
           "checkpoint_dir": str(tmp_path / "ckpt")}  # fmt: skip
    daemon.add_attempt(key, token, job)
    env = gpuopt_env(
        tmp_path / "data",
        {
            **FAST,
            "GPUOPT_DAEMON_URL": daemon.url,
            "GPUOPT_AGENT_TOKEN": token,
            "GPUOPT_ATTEMPT_KEY": key,
            "GPUOPT_METADATA_KIND": "aws-imds",
            "GPUOPT_METADATA_URL": "http://127.0.0.1:9",  # nothing there: no notices
            "GPUOPT_CLOUD": "local",
            "GPUOPT_AGENT_DIR": str(agent_dir),
        },
    )

    def agent() -> subprocess.Popen[bytes]:
        out = (tmp_path / "agent-console.log").open("ab")
        return subprocess.Popen([*GPUOPT, "agent", "run"], env=env, stdout=out, stderr=out)

    first = second = agent()
    job_pid: int | None = None
    try:
        wait_until(lambda: "line 20\n" in daemon.output(key), timeout=30, what="some output")
        job_pid = read_json(agent_dir / "run.json")["pid"]
        first.send_signal(signal.SIGKILL)  # the agent dies; the job, in its own session, runs on
        first.wait(10)
        shipped = len(daemon.output(key))
        wait_until(
            lambda: (agent_dir / "job.log").stat().st_size > shipped + 200,
            what="output written while no agent runs",
        )
        second = agent()
        agent_log = tmp_path / "agent-console.log"
        wait_until(
            lambda: "adopting the job an earlier agent left running" in agent_log.read_text(),
            timeout=30,
            what="the new agent to adopt the job",
        )
        release.touch()
        second.wait(60)  # (its status says nothing: an adopted job's own is unknown)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
        if job_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job_pid, signal.SIGKILL)

    stdout, stderr = daemon.output(key, "stdout"), daemon.output(key, "stderr")
    assert stdout == (agent_dir / "job.log").read_text()  # nothing lost, nothing twice
    assert stderr == (agent_dir / "job.err.log").read_text()
    assert daemon.log_conflicts == []
    lines = [line for line in stdout.splitlines() if line.startswith("line ")]
    assert lines == [f"line {i}" for i in range(len(lines))] and "\nend " in stdout
    assert stderr.splitlines() == [f"err {i}" for i in range(0, len(lines), 7)]
    exited = daemon.of_kind("job_exited")[0]["data"]
    assert exited["adopted"] is True and exited["log_chunks"] == len(daemon.logs[key])
