"""Cost lines (one attempt in one calendar month) and their totals by group (pure).

A `Line` is what the ledger stores for an ended attempt (frozen) and computes for a live one:
the attempt's identity and pool, the month it falls in, and its `Cost` there. Every surface
(`gpuopt costs`, `GET /costs`, the FOCUS export, the metrics, the monthly summary) reads lines
and groups them with `group_lines`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from optimizer.costs.ledger import Cost, total


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
