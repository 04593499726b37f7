"""What a deadline strategy sees and answers: the situation of one job, and its decision.

Pure values: the daemon builds a `Situation` from the store, the backtest from a trace, and
both ask the same strategy (strategies.py). Times are seconds; the restart overhead is what
one start on a new instance costs (boot, set-up, work lost since the last checkpoint).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import ClassVar

# Where no prices are given, spot is assumed at this share of on-demand (the usual V100
# discount in the deadline literature: docs/deadlines.md).
DEFAULT_SPOT_RATIO = 0.3
# Where the caller does not say how long until the next decision (the daemon's timer).
DEFAULT_INTERVAL_S = 300.0


class Use(StrEnum):
    """What a job runs on."""

    SPOT = "spot"
    ON_DEMAND = "on_demand"
    WAIT = "wait"  # nothing runs


@dataclass(frozen=True, slots=True)
class ZoneStats:
    """What has been seen of one spot zone (pool) so far."""

    observed_s: float = 0.0  # seconds watched
    available_s: float = 0.0  # of which spot was obtainable
    interruptions: int = 0  # spot runs (up spells) ended by the market
    # How long the zone has been as it is now (up: spot obtainable; down: not); None where
    # not known. Spells are long-tailed: a long down spell is likely to last.
    spell_s: float | None = None


_NO_STATS: Mapping[str, ZoneStats] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Situation:
    """Everything a strategy sees at one decision."""

    elapsed_s: float  # since the job's start (submit)
    deadline_s: float  # the deadline, seconds after the start
    work_left_s: float  # seconds of work left (at the speed of the reference type)
    overhead_s: float  # what one restart costs in seconds (start-up + lost work)
    running: Use  # what runs now (WAIT: nothing)
    zone: str | None  # where it runs now (None: nothing runs, or on-demand)
    spot_now: frozenset[str]  # zones where spot can be had now
    stats: Mapping[str, ZoneStats] = field(default_factory=lambda: _NO_STATS)  # per zone
    spot_price: float | None = None  # $/h where known (else DEFAULT_SPOT_RATIO is assumed)
    on_demand_price: float | None = None
    # The longest time until the next decision (a trace's tick, the daemon's timer): the
    # safety net keeps one such interval in hand.
    interval_s: float = DEFAULT_INTERVAL_S
    # The whole job's work where known (the uniform-progress line needs it).
    work_s: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    use: Use
    zone: str | None  # the spot zone to use (None: on-demand anywhere / wait)
    reason: str  # one line for people: "slack 5.2 h > 0.4 h: spot in us-east-1a"
    at_risk: bool = False  # the deadline cannot be met on spot alone


def slack_s(s: Situation) -> float:
    """Time to spare if the job ran on-demand without a break from now: the deadline less
    the elapsed time, the work left and (unless it already runs on-demand) one restart."""
    restart = 0.0 if s.running is Use.ON_DEMAND else s.overhead_s
    return s.deadline_s - s.elapsed_s - s.work_left_s - restart


def at_risk(s: Situation) -> bool:
    """The slack is below what one more restart costs: only on-demand, run without a break
    from now, still meets the deadline (or nothing does)."""
    return slack_s(s) < s.overhead_s


def missed(s: Situation) -> bool:
    """The deadline has passed with work left."""
    return s.elapsed_s > s.deadline_s and s.work_left_s > 0


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


class DeadlineStrategy(ABC):
    """A named rule from a situation to a decision (no state: the same situation always
    gets the same answer)."""

    name: ClassVar[str]

    @abstractmethod
    def decide(self, s: Situation) -> Decision: ...
