"""The agent's standby start (docs/standby.md) with a real job process: started while the
fence holds, it waits for the go, which comes once the fence has lifted and the newest
checkpoint is restored; a job without `standby` still starts only after the fence; a stop
(or a signal) during standby ends the job, never reported as started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from optimizer import standby
from optimizer.agent import Agent
from optimizer.agent.reporter import DaemonError
from optimizer.agent.standby import READY_POLL_S
from optimizer.checkpoints import Uploader, commit
from optimizer.common.procs import proc_start_ticks
from tests.helpers import wait_until
from tests.helpers.agent_checkpoints import URI, FencedDaemon, agent_on, data_of
from tests.helpers.code_archive import archive
from tests.helpers.fake_store import FakeStore

# Builds "the model", says it is ready (pid, and what it saw of standby), waits for the go,
# then loads the newest checkpoint in its folder and says which. SIGTERM only sets a flag (as a
# training job's handler does): a stop in standby must end it all the same.
JOB = """
import json, os, signal, sys
from pathlib import Path
from optimizer.standby import wait_for_go
signal.signal(signal.SIGTERM, lambda s, f: None)
if os.environ.get("CRASH"):
    sys.exit("could not build the model")
marks = Path(os.environ["MARKS"])
(marks / "ready.json").write_text(json.dumps({
    "pid": os.getpid(),
    "pgid": os.getpgrp(),
    "standby": os.environ.get("GPUOPT_STANDBY"),
    "go_file": os.environ.get("GPUOPT_GO_FILE"),
    "seen": sorted(n for n in os.listdir(os.environ["GPUOPT_CHECKPOINT_DIR"]) if n[0] != "."),
}))
wait_for_go()
here = os.environ["GPUOPT_CHECKPOINT_DIR"]
steps = [n for n in os.listdir(here) if n.startswith("step-")]
newest = max(steps, key=lambda n: int(n.split("-")[1]))
text = open(os.path.join(here, newest, "model.txt")).read()
(marks / "loaded.txt").write_text(text)
print("loaded", newest, text, flush=True)
"""


def spec(tmp_path: Path, *, standby: bool) -> dict[str, Any]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    job: dict[str, Any] = {
        "name": "train",
        "run": f"{sys.executable} {script}",
        "env": {"MARKS": str(marks), "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        "checkpoint": {"uri": URI, "keep": 3},
        "probes": "none",
    }
    if standby:
        job["standby"] = True
    return {"job": job, "heartbeat_s": 0.05}


class OldAttempt:
    """The old attempt's job, as its checkpoints reach the bucket."""

    def __init__(self, tmp_path: Path, store: FakeStore) -> None:
        self.folder = tmp_path / "old-instance"
        self.uploader = Uploader(store, self.folder)

    def checkpoint(self, step: int) -> None:
        (self.folder / f"step-{step}").mkdir(parents=True)
        (self.folder / f"step-{step}" / "model.txt").write_text(f"weights {step}")
        commit(self.folder / f"step-{step}", step)
        self.uploader.flush(10)


def start(agent: Agent) -> dict[str, int]:
    result: dict[str, int] = {}
    threading.Thread(target=lambda: result.setdefault("code", agent.run()), daemon=True).start()
    return result


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, exited and not yet reaped, does not)."""
    return proc_start_ticks(pid) is not None


def test_a_standby_job_starts_at_the_fence_and_loads_the_newest_checkpoint_after_the_go(
    tmp_path: Path,
) -> None:
    store = FakeStore(tmp_path / "bucket")
    old = OldAttempt(tmp_path, store)
    old.checkpoint(1)
    daemon = FencedDaemon(spec(tmp_path, standby=True))
    instance = tmp_path / "i-2"
    agent = agent_on(instance, daemon, store)
    result = start(agent)
    ready_file = tmp_path / "marks" / "ready.json"
    wait_until(ready_file.exists, 30, "the job to be ready in standby")
    ready = json.loads(ready_file.read_text())
    # Started while fenced: its process runs, it knows it is in standby, nothing restored yet.
    assert daemon.fenced.is_set() and alive(ready["pid"])
    assert ready["standby"] == "1" and ready["go_file"] == str(instance / "standby-go")
    assert ready["seen"] == []
    assert agent.state == "standby"
    assert "job_started" not in daemon.kinds() and "checkpoint_restored" not in daemon.kinds()
    # It said it waits: the daemon may now stop the old job.
    wait_until(lambda: data_of(daemon, "standby_ready"), 30, "standby_ready")
    [said] = data_of(daemon, "standby_ready")
    assert said["exited"] is False and said["startup_s"] > 0
    assert agent.standby is not None and agent.standby.poll_s(0.25) == READY_POLL_S  # asks faster
    # The old job's final checkpoint arrives after the new job was ready; then the fence lifts.
    old.checkpoint(2)
    assert not (tmp_path / "marks" / "loaded.txt").exists()  # it waits for the go
    daemon.fenced.clear()
    wait_until(lambda: "code" in result, 30, "the agent to finish")
    assert result["code"] == 0
    assert (tmp_path / "marks" / "loaded.txt").read_text() == "weights 2"
    kinds = daemon.kinds()
    assert (
        kinds.index("checkpoint_restored") < kinds.index("job_started") < kinds.index("job_exited")
    )
    [restored] = data_of(daemon, "checkpoint_restored")
    assert restored["name"] == "step-2"
    [started] = data_of(daemon, "job_started")
    assert started["pid"] == ready["pgid"] and started["standby"] is True  # its shell
    assert started["standby_since"] <= next(e.at for e in daemon.events if e.kind == "job_started")
    [exited] = data_of(daemon, "job_exited")
    assert exited["exit_code"] == 0 and exited["phase"] == "run"


def test_a_job_without_standby_still_starts_only_after_the_fence(tmp_path: Path) -> None:
    store = FakeStore(tmp_path / "bucket")
    OldAttempt(tmp_path, store).checkpoint(1)
    daemon = FencedDaemon(spec(tmp_path, standby=False))
    instance = tmp_path / "i-2"
    agent = agent_on(instance, daemon, store)
    result = start(agent)
    staged = instance / "checkpoint-staging" / "step-1" / ".gpuopt-committed"
    wait_until(staged.exists, 30, "the prefetch at the fence")
    assert agent.state == "fenced" and agent.job is None
    assert not (tmp_path / "marks" / "ready.json").exists()
    assert not (instance / "standby-go").exists()
    daemon.fenced.clear()
    wait_until(lambda: "code" in result, 30, "the agent to finish")
    ready = json.loads((tmp_path / "marks" / "ready.json").read_text())
    assert ready["standby"] is None and ready["go_file"] is None
    assert ready["seen"] == ["step-1"]  # restored before it started
    assert (tmp_path / "marks" / "loaded.txt").read_text() == "weights 1"
    [started] = data_of(daemon, "job_started")
    assert "standby" not in started


def test_a_stop_during_standby_ends_the_job_and_the_attempt_as_a_stop_at_the_fence(
    tmp_path: Path,
) -> None:
    store = FakeStore(tmp_path / "bucket")
    OldAttempt(tmp_path, store).checkpoint(1)
    daemon = FencedDaemon(spec(tmp_path, standby=True))
    # A long grace: the job (which ignores SIGTERM) must end on the stop word, not on SIGKILL.
    agent = agent_on(tmp_path / "i-2", daemon, store, stop_grace_s=600)
    result = start(agent)
    ready_file = tmp_path / "marks" / "ready.json"
    wait_until(ready_file.exists, 30, "the job to be ready in standby")
    pid = json.loads(ready_file.read_text())["pid"]
    daemon.commands.append({"kind": "stop", "reason": "cancelled", "grace_s": 600})
    wait_until(lambda: "code" in result, 30, "the agent to finish")
    assert result["code"] == 0
    assert not alive(pid)
    kinds = daemon.kinds()
    assert "stopped" in kinds
    assert "job_started" not in kinds and "job_exited" not in kinds
    assert data_of(daemon, "stopped") == [{"reason": "cancelled"}]
    assert not (tmp_path / "marks" / "loaded.txt").exists()
    log = (tmp_path / "i-2" / "agent" / "job.log").read_text()
    assert "run: exited with 143" in log


def test_a_signal_during_standby_ends_the_job_with_the_agent(tmp_path: Path) -> None:
    store = FakeStore(tmp_path / "bucket")
    daemon = FencedDaemon(spec(tmp_path, standby=True))
    agent = agent_on(tmp_path / "i-2", daemon, store, stop_grace_s=600)
    result = start(agent)
    ready_file = tmp_path / "marks" / "ready.json"
    wait_until(ready_file.exists, 30, "the job to be ready in standby")
    pid = json.loads(ready_file.read_text())["pid"]
    agent.deliver_signal(signal.SIGTERM)
    wait_until(lambda: "code" in result, 30, "the agent to finish")
    assert result["code"] == 128 + signal.SIGTERM
    assert not alive(pid) and "job_started" not in daemon.kinds()


# A job in standby that, as a training job does, only notes a SIGTERM.
ORPHAN = (
    "import signal, sys; from optimizer.standby import wait_for_go; "
    "signal.signal(signal.SIGTERM, lambda s, f: None); open(sys.argv[1], 'w').close(); "
    "wait_for_go()"
)


def test_a_restarted_agent_ends_the_job_an_earlier_one_left_in_standby(tmp_path: Path) -> None:
    store = FakeStore(tmp_path / "bucket")
    OldAttempt(tmp_path, store).checkpoint(1)
    daemon = FencedDaemon(spec(tmp_path, standby=True))
    instance = tmp_path / "i-2"
    agent = agent_on(instance, daemon, store, stop_grace_s=600)
    # What an agent that died during standby leaves: its job waiting on the go file, in a
    # session of its own, and its record saying so.
    go = agent.config.go_file
    go.parent.mkdir(parents=True, exist_ok=True)
    standby.prepare(go)
    env = {**os.environ, "GPUOPT_STANDBY": "1", "GPUOPT_GO_FILE": str(go)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    orphan = subprocess.Popen(
        [sys.executable, "-c", ORPHAN, str(tmp_path / "orphan-ready")],
        env=env,
        start_new_session=True,
    )
    record = {"phase": "standby", "pid": orphan.pid, "start_ticks": proc_start_ticks(orphan.pid)}
    (instance / "agent" / "run.json").write_text(
        json.dumps({"attempt_key": agent.config.attempt_key, **record})
    )
    wait_until((tmp_path / "orphan-ready").exists, 30, "the orphan to wait")
    result = start(agent)
    ready_file = tmp_path / "marks" / "ready.json"
    wait_until(ready_file.exists, 30, "the new job to be ready in standby")
    # Told to stop, it never got a go: it exits 143 on the stop word, or dies of the SIGTERM
    # that follows it when that lands while its interpreter is already shutting down (the
    # ignoring handler is gone by then).
    assert orphan.wait(timeout=30) in (143, -signal.SIGTERM)
    daemon.fenced.clear()
    wait_until(lambda: "code" in result, 30, "the agent to finish")
    assert (tmp_path / "marks" / "loaded.txt").read_text() == "weights 1"


def test_a_start_up_that_fails_in_standby_is_reported_and_its_exit_once_the_fence_lifts(
    tmp_path: Path,
) -> None:
    store = FakeStore(tmp_path / "bucket")
    answer = spec(tmp_path, standby=True)
    answer["job"]["env"]["CRASH"] = "1"
    daemon = FencedDaemon(answer)
    agent = agent_on(tmp_path / "i-2", daemon, store)
    result = start(agent)
    # The old job need not wait for it: its start-up has failed.
    wait_until(lambda: data_of(daemon, "standby_ready"), 30, "standby_ready")
    assert data_of(daemon, "standby_ready")[0]["exited"] is True
    assert "job_exited" not in daemon.kinds()  # the old job still runs: nothing is said yet
    daemon.fenced.clear()
    wait_until(lambda: "code" in result, 30, "the agent to finish")
    assert result["code"] == 1
    kinds = daemon.kinds()
    assert kinds.index("job_started") < kinds.index("job_exited")
    [exited] = data_of(daemon, "job_exited")
    assert exited["exit_code"] == 1


class RefusingFencedDaemon(FencedDaemon):
    """Fenced, and its code route refuses the agent."""

    def download(self, url: str, dest: Path, *, timeout_s: float = 300.0) -> None:
        raise DaemonError(f"{url} answered 403: not this job's code", retryable=False, status=403)


def test_code_that_cannot_be_fetched_for_a_standby_start_is_tried_again_after_the_fence(
    tmp_path: Path,
) -> None:
    code, _ = archive(tmp_path)
    answer = spec(tmp_path, standby=True)
    answer["job"]["code"] = code.wire()
    daemon = RefusingFencedDaemon(answer)
    agent = agent_on(tmp_path / "i-2", daemon, FakeStore(tmp_path / "bucket"))
    result = start(agent)
    # Not the attempt's end while the old job runs: it waits at the fence as without standby.
    wait_until(lambda: agent.state == "fenced" and agent.standby is None, 30, "the fallback")
    assert "code_failed" not in daemon.kinds() and "job_exited" not in daemon.kinds()
    daemon.fenced.clear()
    wait_until(lambda: "code" in result, 30, "the agent to finish")
    assert result["code"] == 1
    said = [k for k in daemon.kinds() if k not in ("gpu_telemetry", "checkpoint_failed")]
    assert said == ["code_failed", "job_exited"]  # no standby_ready, no job_started
