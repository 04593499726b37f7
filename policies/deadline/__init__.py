"""Deadline strategies (docs/deadlines.md)."""

from policies.deadline.model import (
    STRATEGIES,
    DeadlineStrategy,
    Decision,
    Situation,
    Use,
    ZoneStats,
    at_risk,
    missed,
    slack_s,
    strategy,
)

__all__ = [
    "STRATEGIES",
    "DeadlineStrategy",
    "Decision",
    "Situation",
    "Use",
    "ZoneStats",
    "at_risk",
    "missed",
    "slack_s",
    "strategy",
]
