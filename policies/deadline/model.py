"""Deadline strategies: spot or on-demand at each decision so that a job meets its deadline.

A minimal greedy stand-in with the contract's names: spot while the slack allows, on-demand
once it does not. Pure: no I/O, no clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar


class Use(StrEnum):
    """What a job runs on."""

    SPOT = "spot"
    ON_DEMAND = "on_demand"
    WAIT = "wait"  # nothing runs


@dataclass(frozen=True, slots=True)
class ZoneStats:
    """What has been seen of one spot zone (pool) so far."""

    observed_s: float = 0.0
    available_s: float = 0.0
    interruptions: int = 0


@dataclass(frozen=True, slots=True)
class Situation:
    """Everything a strategy sees at one decision."""

    elapsed_s: float
    deadline_s: float
    work_left_s: float
    overhead_s: float
    running: Use
    zone: str | None
    spot_now: frozenset[str]
    stats: Mapping[str, ZoneStats] = field(default_factory=dict)
    spot_price: float | None = None
    on_demand_price: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    use: Use
    zone: str | None
    reason: str
    at_risk: bool = False


def slack_s(s: Situation) -> float:
    """The deadline less the time elapsed, the work left and (unless the job runs on-demand)
    one restart."""
    restart = 0.0 if s.running is Use.ON_DEMAND else s.overhead_s
    return s.deadline_s - s.elapsed_s - s.work_left_s - restart


def at_risk(s: Situation) -> bool:
    """The slack is below what one more restart costs."""
    return slack_s(s) < s.overhead_s


def missed(s: Situation) -> bool:
    """The deadline has passed with work left."""
    return s.elapsed_s > s.deadline_s and s.work_left_s > 0


class DeadlineStrategy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def decide(self, s: Situation) -> Decision: ...


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if abs(seconds) >= 360 else f"{seconds:.0f} s"


class Greedy(DeadlineStrategy):
    """Spot while the slack is above one restart's overhead, else on-demand; back to spot
    only when the slack also pays for the move."""

    name: ClassVar[str] = "greedy"

    def decide(self, s: Situation) -> Decision:
        slack = slack_s(s)
        risk = at_risk(s)
        # Leaving on-demand costs a restart itself.
        spare = slack - s.overhead_s if s.running is Use.ON_DEMAND else slack
        if spare <= s.overhead_s:
            return Decision(
                Use.ON_DEMAND,
                None,
                f"slack {_hours(slack)} <= {_hours(s.overhead_s)}: on-demand",
                risk,
            )
        if s.running is Use.SPOT and s.zone is not None:
            return Decision(Use.SPOT, s.zone, f"slack {_hours(slack)}: spot in {s.zone}", risk)
        if s.spot_now:
            zone = sorted(s.spot_now)[0]
            return Decision(Use.SPOT, zone, f"slack {_hours(slack)}: spot in {zone}", risk)
        return Decision(Use.WAIT, None, f"slack {_hours(slack)}: waiting for spot", risk)


class Ours(Greedy):
    name: ClassVar[str] = "gpuopt"


class UniformProgress(Greedy):
    name: ClassVar[str] = "uniform-progress"


STRATEGIES: Mapping[str, type[DeadlineStrategy]] = {
    k.name: k for k in (Ours, Greedy, UniformProgress)
}


def strategy(name: str = "gpuopt") -> DeadlineStrategy:
    kind = STRATEGIES.get(name)
    if kind is None:
        raise ValueError(f"unknown deadline strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return kind()
