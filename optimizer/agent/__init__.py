"""The agent that runs on each managed instance (docs/agent-protocol.md).

Importing this package loads neither torch nor the probes: the probes are imported only when
a job asks for them. Its names are loaded on first use, so `python -m optimizer.agent.inventory`
(run over SSH when an owned machine is added) starts without httpx or pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optimizer.agent.agent import Agent
    from optimizer.agent.config import AgentConfig, AgentConfigError, Assignment
    from optimizer.agent.imds import (
        WATCHERS,
        AwsImds,
        GcpMetadata,
        Notice,
        UnknownWatcherKind,
        Watcher,
        make_watcher,
    )
    from optimizer.agent.reporter import DaemonClient, DaemonError, Event, EventQueue, Reporter
    from optimizer.agent.runner import JobExit, JobRunner
    from optimizer.agent.start import run_agent

_HOMES = {
    "optimizer.agent.agent": ("Agent",),
    "optimizer.agent.config": ("AgentConfig", "AgentConfigError", "Assignment"),
    "optimizer.agent.imds": (
        "WATCHERS",
        "AwsImds",
        "GcpMetadata",
        "Notice",
        "UnknownWatcherKind",
        "Watcher",
        "make_watcher",
    ),
    "optimizer.agent.reporter": ("DaemonClient", "DaemonError", "Event", "EventQueue", "Reporter"),
    "optimizer.agent.runner": ("JobExit", "JobRunner"),
    "optimizer.agent.start": ("run_agent",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "WATCHERS",
    "Agent",
    "AgentConfig",
    "AgentConfigError",
    "Assignment",
    "AwsImds",
    "DaemonClient",
    "DaemonError",
    "Event",
    "EventQueue",
    "GcpMetadata",
    "JobExit",
    "JobRunner",
    "Notice",
    "Reporter",
    "UnknownWatcherKind",
    "Watcher",
    "make_watcher",
    "run_agent",
]
