"""Cost lines (one attempt in one calendar month) and their totals by group (pure).

A `Line` is what the ledger stores for an ended attempt (frozen) and computes for a live one:
the attempt's identity and pool, the month it falls in, and its `Cost` there. Every surface
(`gpuopt costs`, `GET /costs`, the FOCUS export, the metrics, the monthly summary) reads lines
and groups them with `group_lines`, or reads a group's sums (`Totals`, which the store can
add up itself for frozen lines) where it needs no line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from optimizer.costs.ledger import NONE, Cost, total

INSTANCE = "instance"
CHECKPOINT_STORAGE = "checkpoint-storage"
EGRESS = "egress"
# Whose instance time a line prices: the job's attempt, or the job's warm spare while it idles
# (a spare that took the job over is the job's attempt; its wait before is its overhead).
JOB_ROLE = "job"
WARM_SPARE = "warm_spare"


class GroupBy(StrEnum):
    JOB = "job"
    POLICY = "policy"
    PROVIDER = "provider"
    MARKET = "market"
    MONTH = "month"


@dataclass(frozen=True, slots=True)
class Line:
    """One attempt's cost inside one calendar month (UTC)."""

    job_id: int
    job: str
    policy: str
    attempt: int  # the attempt's number within its job
    provider: str
    region: str
    zone: str | None
    instance_type: str
    market: str
    instance_id: str | None
    launched: datetime
    ended: datetime | None  # None: live
    period_start: datetime
    period_end: datetime
    cost: Cost
    frozen: bool = False  # an ended attempt's line, stored when it ended
    # What the line prices: the attempt's instance (and its root volume), or the job's state
    # (optimizer/costs/state_lines.py): a checkpoint at rest, or the data a restore moved.
    kind: str = "instance"  # INSTANCE | CHECKPOINT_STORAGE | EGRESS
    quantity: float = 0.0  # GB-months (checkpoint storage) or GB (egress); 0 for instances
    resource: str | None = None  # the checkpoint's name or URI (state lines)
    role: str = JOB_ROLE  # JOB_ROLE | WARM_SPARE (an instance line)

    @property
    def month(self) -> str:
        return f"{self.period_start.year:04d}-{self.period_start.month:02d}"


_KEYS: dict[GroupBy, Callable[[Line], str]] = {
    GroupBy.JOB: lambda line: line.job,
    GroupBy.POLICY: lambda line: line.policy,
    GroupBy.PROVIDER: lambda line: line.provider,
    GroupBy.MARKET: lambda line: line.market,
    GroupBy.MONTH: lambda line: line.month,
}


@dataclass(frozen=True, slots=True)
class Group:
    """The lines of one group and their summed cost."""

    key: str
    lines: tuple[Line, ...]
    cost: Cost


def group_lines(lines: Iterable[Line], by: GroupBy) -> list[Group]:
    """Lines grouped by `by`, groups in key order (months oldest first)."""
    key = _KEYS[by]
    buckets: dict[str, list[Line]] = {}
    for line in lines:
        buckets.setdefault(key(line), []).append(line)
    return [
        Group(name, tuple(items), total(item.cost for item in items))
        for name, items in sorted(buckets.items())
    ]


@dataclass(frozen=True, slots=True)
class Totals:
    """One group's sums: `cost` over all its lines, `priced` over those whose on-demand
    baseline is known (savings are taken over these only: a line without a baseline has
    spend but nothing to save against), and how many attempts have a line in the group."""

    key: str
    cost: Cost = NONE
    priced: Cost = NONE
    attempts: int = 0
    markets: tuple[Totals, ...] = ()
    """The same sums split by market (keys in order), when the grouping asked for them."""

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.key,
            self.cost + other.cost,
            self.priced + other.priced,
            self.attempts + other.attempts,
            tuple(merge_totals(self.markets, other.markets)),
        )


def totals_by(lines: Iterable[Line], by: GroupBy, *, markets: bool = False) -> list[Totals]:
    """The sums of `lines` grouped by `by`, in key order (months oldest first); with
    `markets`, each group's sums split by market as well."""
    return [
        Totals(
            group.key,
            group.cost,
            total(line.cost for line in group.lines if line.cost.baseline_known),
            len({(line.job_id, line.attempt) for line in group.lines if line.kind == INSTANCE}),
            tuple(totals_by(group.lines, GroupBy.MARKET)) if markets else (),
        )
        for group in group_lines(lines, by)
    ]


def merge_totals(*parts: Iterable[Totals]) -> list[Totals]:
    """Groups of several sources (frozen sums, live lines) added up by key, in key order.
    An attempt is frozen whole or not at all, so attempt counts add."""
    merged: dict[str, Totals] = {}
    for part in parts:
        for group in part:
            held = merged.get(group.key)
            merged[group.key] = group if held is None else held + group
    return [merged[key] for key in sorted(merged)]
