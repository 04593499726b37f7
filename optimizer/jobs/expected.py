"""The inputs of expected-cost ranking from the store (the model is policies/risk.py).

- `pool_histories`: per pool, the attempt-hours of every job's attempts within
  `risk.HISTORY` and the interruptions among them (a notice reached the agent, or the
  provider reported the instance preempted), with the last one's time.
- `overhead_of`: the restart overhead to rank a policy's (or a job's) launch with: the cost
  ledger's overhead of its relaunched attempts (attempt 2 onwards), else the times from an
  interruption to the job running on the next attempt, else the default.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from optimizer.jobs.ledger import Ledger
from optimizer.model import Pool
from optimizer.store import Store
from optimizer.store.jobs import AttemptRecord
from policies import risk


def interrupted(a: AttemptRecord) -> bool:
    """The cloud took the attempt back (as gpuopt_job_interruptions_total counts them)."""
    return a.notice_at is not None or a.preempted


def histories_of(
    attempts: Iterable[AttemptRecord], since: datetime, now: datetime
) -> dict[Pool, risk.PoolHistory]:
    """Attempt-hours within [since, now] and interruptions in it, per pool (pure)."""
    hours: dict[Pool, float] = defaultdict(float)
    count: dict[Pool, int] = defaultdict(int)
    last: dict[Pool, datetime] = {}
    for a in attempts:
        start = max(a.launched_at or a.started_at, since)
        end = min(a.ended_at or now, now)
        if end > start:
            hours[a.pool] += (end - start).total_seconds() / 3600
        if interrupted(a):
            at = a.notice_at or a.ended_at or now
            if since <= at <= now:
                count[a.pool] += 1
                if a.pool not in last or at > last[a.pool]:
                    last[a.pool] = at
    pools = set(hours) | set(count)
    return {p: risk.PoolHistory(hours.get(p, 0.0), count.get(p, 0), last.get(p)) for p in pools}


def pool_histories(store: Store, now: datetime) -> dict[Pool, risk.PoolHistory]:
    since = now - risk.HISTORY
    return histories_of(store.jobs.attempts_since(since), since, now)


def notice_to_running(attempts: Iterable[AttemptRecord]) -> list[float]:
    """Hours from each interruption (its notice, else its end) to the job running on the
    job's next attempt, where it ran again (pure)."""
    by_job: dict[int, dict[int, AttemptRecord]] = defaultdict(dict)
    for a in attempts:
        by_job[a.job_id][a.number] = a
    out = []
    for numbered in by_job.values():
        for number, a in numbered.items():
            after = numbered.get(number + 1)
            since = a.notice_at or a.ended_at
            if interrupted(a) and since is not None and after and after.job_started_at:
                out.append((after.job_started_at - since).total_seconds() / 3600)
    return out


def overhead_of(
    store: Store, policy: str, now: datetime, *, job_id: int | None = None
) -> risk.Overhead:
    """The restart overhead (module docstring): the job's own figures where it has them,
    else the policy's."""
    since = now - risk.HISTORY
    attempts = [a for a in store.jobs.policy_attempts(policy, since)]
    if job_id is not None and any(a.job_id == job_id and a.number > 1 for a in attempts):
        attempts = [a for a in attempts if a.job_id == job_id]
    relaunched = {a.id for a in attempts if a.number > 1 and a.ended_at is not None}
    ledger: list[float] = []
    if relaunched:
        seconds: dict[tuple[int, int], float] = defaultdict(float)
        for line in Ledger(store).lines(since=since, policy=policy, now=now):
            if line.attempt > 1 and line.ended is not None:
                seconds[(line.job_id, line.attempt)] += line.cost.overhead_seconds
        wanted = {(a.job_id, a.number) for a in attempts if a.id in relaunched}
        ledger = [s / 3600 for key, s in seconds.items() if key in wanted and s > 0]
    return risk.restart_overhead(ledger, notice_to_running(attempts))


__all__ = ["histories_of", "interrupted", "notice_to_running", "overhead_of", "pool_histories"]
