"""The agent that runs on each managed instance (docs/agent-protocol.md).

Importing this package loads neither torch nor the probes: the probes are imported only when
a job asks for them.
"""

from optimizer.agent.agent import Agent
from optimizer.agent.config import AgentConfig, AgentConfigError, Assignment
from optimizer.agent.imds import AwsImds, GcpMetadata, Notice, Watcher, make_watcher
from optimizer.agent.reporter import DaemonClient, DaemonError, Event, EventQueue, Reporter
from optimizer.agent.runner import JobExit, JobRunner

__all__ = [
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
    "Watcher",
    "make_watcher",
]
