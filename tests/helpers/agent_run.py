"""An agent against a scripted daemon, run in a thread, for the agent loop and window tests."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from optimizer.agent import Agent, AgentConfig
from optimizer.common.retry import Backoff
from tests.helpers.agent_loop import ScriptedDaemon, ScriptedWatcher


def agent_for(tmp_path: Path, daemon: ScriptedDaemon, **settings: Any) -> tuple[Agent, Any]:
    config = AgentConfig(
        daemon_url="http://d",
        token="t",
        attempt_key="train/1",
        metadata_kind="aws-imds",
        cloud="local",
        agent_dir=tmp_path / "agent",
        **settings,
    )
    watcher = ScriptedWatcher()
    agent = Agent(
        config,
        client=daemon,  # type: ignore[arg-type]
        watcher=watcher,
        register_backoff=Backoff(base=0.01, cap=0.02),
        send_backoff=Backoff(base=0.01, cap=0.05),
    )
    return agent, watcher


def run_in_thread(agent: Agent) -> dict[str, int]:
    result: dict[str, int] = {}
    threading.Thread(target=lambda: result.setdefault("code", agent.run()), daemon=True).start()
    return result
