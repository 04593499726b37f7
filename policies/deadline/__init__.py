"""Deadlines on spot: the strategies, the trace replay and its offline optimum (pure)."""

from policies.deadline.model import (
    DeadlineStrategy,
    Decision,
    Situation,
    Use,
    ZoneStats,
    at_risk,
    missed,
    slack_s,
)
from policies.deadline.registry import DEFAULT_STRATEGY, STRATEGIES, strategy
from policies.deadline.replay import Outcome, optimum, replay
from policies.deadline.traces import Trace, TraceError, read_traces

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "DeadlineStrategy",
    "Decision",
    "Outcome",
    "Situation",
    "Trace",
    "TraceError",
    "Use",
    "ZoneStats",
    "at_risk",
    "missed",
    "optimum",
    "read_traces",
    "replay",
    "slack_s",
    "strategy",
]
