"""The agent's main loop in-process, with a scripted daemon and metadata watcher: settings,
registration retries, losing the daemon, stopping alone on an interruption, restarts."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from optimizer.agent import AgentConfig, AgentConfigError, Assignment, Notice
from tests.helpers import wait_until
from tests.helpers.agent import read_json
from tests.helpers.agent_loop import ScriptedDaemon, job
from tests.helpers.agent_run import agent_for, run_in_thread

REQUIRED = {
    "GPUOPT_DAEMON_URL": "http://d",
    "GPUOPT_AGENT_TOKEN": "t",
    "GPUOPT_ATTEMPT_KEY": "j/1",
    "GPUOPT_METADATA_KIND": "aws-imds",
}


def test_settings_come_from_the_environment_with_sane_defaults(tmp_path: Path) -> None:
    secret = {"GPUOPT_AGENT_TOKEN": "s3cret-token"}
    config = AgentConfig.from_env({**REQUIRED, **secret, "GPUOPT_CLOUD": "local"})
    assert config.metadata_url == "http://169.254.169.254"
    assert (config.cloud, config.metadata_kind, config.poll_s) == ("local", "aws-imds", 0.5)
    assert config.token == "s3cret-token" and "s3cret" not in repr(config)
    gcp = AgentConfig.from_env(
        {
            **REQUIRED,
            "GPUOPT_CLOUD": "gcp",
            "GPUOPT_METADATA_KIND": "gcp-metadata",
            "GPUOPT_AGENT_DIR": "/x",
        }
    )
    assert gcp.metadata_kind == "gcp-metadata" and gcp.agent_dir == Path("/x")
    # The agent knows no list of providers: a new one's name is as good as any.
    assert AgentConfig.from_env({**REQUIRED, "GPUOPT_CLOUD": "acme"}).cloud == "acme"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "GPUOPT_DAEMON_URL, GPUOPT_AGENT_TOKEN, GPUOPT_ATTEMPT_KEY, GPUOPT_METADATA_KIND"),
        ({**REQUIRED, "GPUOPT_CLOUD": "Azure Cloud"}, "GPUOPT_CLOUD='azure cloud'"),
        (
            {**REQUIRED, "GPUOPT_METADATA_KIND": "azure-imds"},
            "GPUOPT_METADATA_KIND: unknown metadata watcher kind 'azure-imds'; "
            "expected one of aws-imds, gcp-metadata",
        ),
        ({**REQUIRED, "GPUOPT_AGENT_POLL_S": "fast"}, "not a number"),
    ],
)
def test_bad_settings_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(AgentConfigError, match=message):
        AgentConfig.from_env(env)


def test_the_registration_answer_becomes_the_jobs_environment() -> None:
    answer = {
        "job": {"name": "train", "run": "x", "env": {"A": 1}, "checkpoint_dir": "s3://b/c"},
        "attempt": 3,
        "restarts": 2,
        "heartbeat_s": 10,
    }
    env = Assignment.parse(answer).protocol_env()
    assert env == {
        "A": "1",
        "GPUOPT_CHECKPOINT_DIR": "s3://b/c",
        "GPUOPT_ATTEMPT": "3",
        "GPUOPT_RESTARTS": "2",
        "GPUOPT_JOB": "train",
    }
    with pytest.raises(ValueError, match="run"):
        Assignment.parse({"job": {"name": "x"}})
    with pytest.raises(ValueError, match="probes"):
        Assignment.parse({"job": {"run": "x", "probes": "thorough"}})


def test_registration_is_retried_until_the_daemon_answers(tmp_path: Path) -> None:
    daemon = ScriptedDaemon(job(tmp_path, 3), register_failures=3)
    agent, _ = agent_for(tmp_path, daemon)
    assert agent.run() == 0
    assert daemon.registrations == 4
    assert daemon.kinds() == ["job_started", "job_exited"]


def test_losing_the_daemon_does_not_stop_the_job_and_nothing_is_lost(tmp_path: Path) -> None:
    daemon = ScriptedDaemon(job(tmp_path, 30))
    agent, _ = agent_for(tmp_path, daemon, flush_s=0.2)
    daemon.down = True
    result = run_in_thread(agent)
    wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
    assert result["code"] == 0  # the job ran to its end while the daemon was away
    assert (tmp_path / "agent" / "job.log").read_text().count("done 30") == 1
    saved = read_json(tmp_path / "agent" / "events.json")
    kinds = [e["kind"] for e in saved["events"]]
    assert kinds[0] == "job_started" and "job_exited" in kinds  # kept for the next agent


def test_an_ending_notice_the_daemon_never_took_stops_the_job_anyway(tmp_path: Path) -> None:
    daemon = ScriptedDaemon(job(tmp_path, 100000))
    agent, watcher = agent_for(tmp_path, daemon, self_stop_s=0.2, flush_s=0.2)
    result = run_in_thread(agent)
    wait_until(lambda: "job_started" in daemon.kinds(), what="the job to start")
    wait_until(lambda: (tmp_path / "ckpt" / "state.json").exists(), what="a checkpoint")
    daemon.down = True
    watcher.notices.append(Notice("aws-imds-spot", "terminate", "t", "ab" * 32, "{}"))
    wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
    assert result["code"] == 0
    saved = [e for e in read_json(tmp_path / "agent" / "events.json")["events"]]
    stopped = next(e for e in saved if e["kind"] == "stopped")
    assert stopped["data"]["reason"] == "interruption notice; daemon unreachable"
    assert "checkpointed" in (tmp_path / "agent" / "job.log").read_text()


def test_after_an_ending_notice_the_stop_comes_by_poll_not_by_heartbeat(tmp_path: Path) -> None:
    # Heartbeats an hour apart: the stop that hands the job over can only come by the polls
    # the agent makes after an ending notice (every fence_poll_s).
    daemon = ScriptedDaemon({**job(tmp_path, 100000), "heartbeat_s": 3600})
    agent, watcher = agent_for(tmp_path, daemon, fence_poll_s=0.02, flush_s=2)
    result = run_in_thread(agent)
    wait_until(lambda: "job_started" in daemon.kinds(), what="the job to start")
    wait_until(lambda: (tmp_path / "ckpt" / "state.json").exists(), what="a checkpoint")
    assert daemon.polls == 0  # no notice, no polls
    watcher.notices.append(Notice("aws-imds-spot", "terminate", "t", "ab" * 32, "{}"))
    wait_until(lambda: daemon.polls >= 2, what="the agent to poll for commands")
    daemon.commands.append({"kind": "stop", "reason": "attempt 2 is ready to take over"})
    wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
    assert daemon.polled_commands == ["stop"]
    stopped = next(e for e in daemon.events if e.kind == "stopped")
    assert stopped.data["reason"] == "attempt 2 is ready to take over"
    assert "checkpointed" in (tmp_path / "agent" / "job.log").read_text()
    wait_until(
        lambda: not any(t.name == "agent-handover" for t in threading.enumerate()),
        what="the polls to end with the stop",
    )


def test_a_rebalance_hint_alone_does_not_stop_the_job(tmp_path: Path) -> None:
    daemon = ScriptedDaemon(job(tmp_path, 40))
    agent, watcher = agent_for(tmp_path, daemon, self_stop_s=0.05)
    result = run_in_thread(agent)
    wait_until(lambda: "job_started" in daemon.kinds(), what="the job to start")
    daemon.down = True
    watcher.notices.append(Notice("aws-imds-rebalance", "rebalance", "t", "cd" * 32, "{}"))
    wait_until(lambda: agent.queue.has("interruption_notice"), what="the notice to be queued")
    wait_until(lambda: agent.reporter.failures >= 3, what="a few failed sends")
    assert agent._notice_at is None  # a hint arms no self-stop
    daemon.down = False
    wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
    assert "stopped" not in daemon.kinds() and result["code"] == 0


def test_a_restarted_agent_does_not_run_a_finished_job_again(tmp_path: Path) -> None:
    daemon = ScriptedDaemon(job(tmp_path, 3))
    first, _ = agent_for(tmp_path, daemon)
    assert first.run() == 0
    second, _ = agent_for(tmp_path, daemon)
    assert second.run() == 0
    assert daemon.kinds() == ["job_started", "job_exited"]  # no second start


def test_a_restarted_agent_adopts_the_job_its_predecessor_left_running(tmp_path: Path) -> None:
    orphan = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        from optimizer.common.procs import proc_start_ticks

        run = {
            "attempt_key": "train/1",
            "phase": "started",
            "pid": orphan.pid,
            "start_ticks": proc_start_ticks(orphan.pid),
        }
        (tmp_path / "agent").mkdir()
        (tmp_path / "agent" / "run.json").write_text(__import__("json").dumps(run))
        daemon = ScriptedDaemon(job(tmp_path, 3))
        agent, _ = agent_for(tmp_path, daemon)
        result = run_in_thread(agent)
        daemon.commands.append({"kind": "stop", "reason": "interrupted", "grace_s": 5})
        wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
        assert orphan.wait(5) == -15  # the stop reached the adopted job
        exited = next(e for e in daemon.events if e.kind == "job_exited")
        assert exited.data["adopted"] is True and exited.data["exit_code"] is None
        assert daemon.kinds() == ["job_exited", "stopped"]  # never started a second copy
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, 9)
            orphan.wait()


def test_the_jobs_output_reaches_the_daemon_before_its_exit_is_reported(tmp_path: Path) -> None:
    answer = job(tmp_path, 1)
    answer["job"]["run"] = "echo out-1; echo err-1 >&2; printf 'no newline'"
    answer["job"]["setup"] = "echo preparing"
    daemon = ScriptedDaemon(answer)
    agent, _ = agent_for(tmp_path, daemon)
    assert agent.run() == 0
    stdout, stderr = daemon.output("stdout"), daemon.output("stderr")
    assert "preparing\n" in stdout and "out-1\n" in stdout and "no newline" in stdout
    assert "setup: starting" in stdout and "run: exited with 0" in stdout  # the agent's notes
    assert stderr == "err-1\n"
    exited = next(e for e in daemon.events if e.kind == "job_exited")
    assert exited.data["log_chunks"] == len(daemon.chunks) == daemon.chunks_at_exit
    assert sorted(daemon.chunks) == list(range(len(daemon.chunks)))
    # The instance keeps its own copy: stdout in job.log, stderr in job.err.log.
    assert (tmp_path / "agent" / "job.err.log").read_text() == "err-1\n"
    assert (tmp_path / "agent" / "job.log").read_text() == stdout
