"""An agent with a fenced daemon and a fake store, for the checkpoint and standby tests."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from optimizer.agent import Agent, AgentConfig
from optimizer.common.retry import Backoff
from optimizer.protocol import EventsAnswer, Wait
from tests.helpers.agent_loop import ScriptedDaemon, ScriptedWatcher
from tests.helpers.fake_store import FakeStore

URI = "s3://bucket/jobs/train"


# Prints what it finds in its checkpoint folder, then writes and commits STEPS checkpoints;
# with FOREVER it then waits, and on SIGTERM commits a last one (step 99) and exits 143.
JOB = """
import os, signal, sys, time
from optimizer.checkpoints import commit
here = os.environ["GPUOPT_CHECKPOINT_DIR"]
for name in sorted(os.listdir(here)):
    path = os.path.join(here, name, "model.txt")
    if os.path.exists(path):
        print("found", name, open(path).read(), flush=True)

def save(step):
    folder = os.path.join(here, f"step-{step}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.txt"), "w") as f:
        f.write(f"weights {step}")
    commit(folder, step)

stopping = False
def on_term(signum, frame):
    global stopping
    stopping = True
signal.signal(signal.SIGTERM, on_term)
for step in range(1, int(os.environ.get("STEPS", "2")) + 1):
    save(step)
while os.environ.get("FOREVER") and not stopping:
    time.sleep(0.01)
if stopping:
    save(99)
    print("final checkpoint", flush=True)
    sys.exit(143)
print("done", flush=True)
"""


def answer(tmp_path: Path, **env: str) -> dict[str, Any]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return {
        "job": {
            "name": "train",
            "run": f"{sys.executable} {script}",
            "env": env,
            "checkpoint": {"uri": URI, "keep": 3},
            "probes": "none",
        },
        "heartbeat_s": 0.05,
    }


class FencedDaemon(ScriptedDaemon):
    """Answers polls with a fence until `fenced` is cleared."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__({**answer, "fence": "attempt 1's job has not exited yet"})
        self.fenced = threading.Event()
        self.fenced.set()

    def poll(self) -> EventsAnswer:
        fence = Wait.of("attempt 1's job has not exited yet" if self.fenced.is_set() else None)
        return EventsAnswer(fence=fence)


def agent_on(instance: Path, daemon: ScriptedDaemon, store: FakeStore, **settings: Any) -> Agent:
    """An agent on a fresh instance disk: its folder is <instance>/agent, so the job's local
    checkpoint folder is <instance>/checkpoints."""
    settings = {"checkpoint_scan_s": 0.05, "fence_poll_s": 0.02, "flush_s": 10, **settings}
    config = AgentConfig(
        daemon_url="http://d",
        token="t",
        attempt_key=f"train/{instance.name}",
        metadata_kind="aws-imds",
        cloud="local",
        agent_dir=instance / "agent",
        **settings,
    )
    seen: list[str] = []

    def factory(uri: str) -> FakeStore:
        seen.append(uri)
        assert uri == URI
        return store

    return Agent(
        config,
        client=daemon,  # type: ignore[arg-type]
        watcher=ScriptedWatcher(),
        register_backoff=Backoff(base=0.01, cap=0.02),
        send_backoff=Backoff(base=0.01, cap=0.05),
        telemetry_source=lambda: None,
        store_factory=factory,
    )


def data_of(daemon: ScriptedDaemon, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in daemon.events if e.kind == kind]
