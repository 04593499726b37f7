"""What the queue shows of each job (`GET /jobs`, `gpuopt jobs list`): where it runs now,
for how long it has run, and what it has cost so far.

- **placement**: the attempt the job runs on now: the newest live attempt whose job has
  started, else the newest live one (launching, probing; `running` false); none once every
  attempt has ended. During a hot handover the old attempt still runs the job, so the
  placement stays there until the new one takes over (not the last attempt tried).
- **running_s**: the time the job ran, over all its attempts (the union of each attempt's
  span from its job's start to the attempt's end, or now), so a handover's overlap counts
  once.
- **spend_usd**: the job's spend so far as every surface means it (`Cost.spend_usd`: its
  instances' cost, what the on-demand baseline and the savings compare with; the cost
  report's and the console's `spend`), live attempts priced up to now.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from optimizer.clock import utc_text
from optimizer.costs import Line, total
from optimizer.lifecycle import AttemptState
from optimizer.store.jobs import AttemptRecord


def heads(attempts: Iterable[AttemptRecord]) -> list[AttemptRecord]:
    """One row per attempt: a multi-node attempt's rank-0 row stands for its nodes."""
    return [a for a in attempts if a.node_rank == 0]


def current(attempts: Sequence[AttemptRecord]) -> tuple[AttemptRecord, bool] | None:
    """The attempt the job is on now and whether its job runs there (see the module)."""
    live = [a for a in heads(attempts) if a.state != AttemptState.ENDED]
    running = [a for a in live if a.job_started_at is not None]
    if running:
        return running[-1], True
    return (live[-1], False) if live else None


def placement_view(found: tuple[AttemptRecord, bool] | None) -> dict[str, Any] | None:
    """The API's `placement` object (None: the job is on no instance now)."""
    if found is None:
        return None
    a, running = found
    return {
        "attempt": a.number,
        "provider": a.provider,
        "region": a.region,
        "zone": a.zone,
        "instance_type": a.instance_type,
        "market": a.market,
        "usd_per_hour": a.usd_per_hour,
        "nodes": a.nodes,
        "running": running,
        "since": utc_text(a.job_started_at or a.launched_at or a.started_at),
    }


def running_seconds(attempts: Iterable[AttemptRecord], now: datetime) -> float:
    """The union of the attempts' running spans, in seconds (see the module)."""
    spans = sorted(
        (a.job_started_at, a.ended_at or now)
        for a in heads(attempts)
        if a.job_started_at is not None
    )
    out = 0.0
    end: datetime | None = None
    for start, stop in spans:
        if end is not None and start < end:
            start = end
        if stop > start:
            out += (stop - start).total_seconds()
        end = stop if end is None else max(end, stop)
    return out


def spend_by_job(lines: Iterable[Line]) -> dict[int, float]:
    """Each job's spend so far (by job id) from its ledger lines (see the module)."""
    by: dict[int, list[Line]] = {}
    for line in lines:
        by.setdefault(line.job_id, []).append(line)
    return {job_id: total(line.cost for line in items).spend_usd for job_id, items in by.items()}


def queue_fields(
    created_at: datetime, attempts: Sequence[AttemptRecord], spend_usd: float, now: datetime
) -> dict[str, Any]:
    """The queue's fields of one job's API object."""
    return {
        "placement": placement_view(current(attempts)),
        "age_s": max(0.0, (now - created_at).total_seconds()),
        "running_s": running_seconds(attempts, now),
        "spend_usd": round(spend_usd, 6),
    }
