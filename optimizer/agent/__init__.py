"""The agent that runs on each managed instance (docs/agent-protocol.md).

Importing this package loads neither torch nor the probes: the probes are imported only when
a job asks for them.
"""

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
