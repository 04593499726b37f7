"""What the overview page shows, read from the store and the ledger: month-to-date spend,
savings and overhead, each budgeted policy's month as a gauge, the jobs that have not ended
with their placement, current price and GPU utilization, recent alerts, and the replicas."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from optimizer.api.state import ApiState
from optimizer.costs import GroupBy
from optimizer.costs.report import add_up, report
from optimizer.daemon.leader import HEARTBEAT_S, STALE_AFTER
from optimizer.jobs import budget as job_budget
from optimizer.jobs.ledger import Ledger
from optimizer.model import Offer, Pool
from optimizer.store import EventRecord, JobRecord
from optimizer.store.jobs import AttemptRecord
from optimizer.store.replicas import ReplicaRecord
from optimizer.store.telemetry import GpuSampleRecord
from optimizer.ui.render import NONE
from policies import budget

RECENT_ALERTS = 8
ALERT_SEVERITIES = frozenset({"warning", "error", "critical"})
MISSED_BEATS = 3  # as GET /replicas: a replica that missed this many heartbeats is not alive


@dataclass(frozen=True, slots=True)
class Month:
    start: datetime
    end: datetime
    total: dict[str, Any]  # add_up of the groups by market
    by_market: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Gauge:
    policy: str
    cap_usd: float
    spent_usd: float
    projected_usd: float
    live_attempts: int

    @property
    def spent_ratio(self) -> float:
        return self.spent_usd / self.cap_usd

    @property
    def projected_ratio(self) -> float:
        return self.projected_usd / self.cap_usd


@dataclass(frozen=True, slots=True)
class LiveJob:
    job: JobRecord
    attempt: AttemptRecord | None
    price_usd_per_hour: float | None  # the pool's latest price, else the launch price
    gpu: GpuSampleRecord | None

    @property
    def placement(self) -> str:
        a = self.attempt
        if a is None:
            return NONE
        return f"{a.provider} {a.zone or a.region} {a.instance_type} {a.market}"


@dataclass(frozen=True, slots=True)
class Replica:
    record: ReplicaRecord
    alive: bool


@dataclass(frozen=True, slots=True)
class Overview:
    now: datetime
    month: Month
    gauges: list[Gauge]
    live: list[LiveJob]
    alerts: list[EventRecord]
    alert_counts: dict[str, int]
    replicas: list[Replica]
    leader: str | None
    answered_by: str | None


def latest_prices(offers: Iterable[Offer]) -> dict[Pool, float]:
    """The cheapest latest price of each pool."""
    out: dict[Pool, float] = {}
    for o in offers:
        out[o.pool] = min(o.usd_per_hour, out.get(o.pool, float("inf")))
    return out


def month_to_date(state: ApiState, now: datetime) -> Month:
    start, end = budget.month_bounds(now)
    groups = report(
        Ledger(state.store, state.clock).groups(GroupBy.MARKET, since=start, until=end, now=now)
    )
    return Month(start, end, add_up(groups), groups)


def gauges(state: ApiState, now: datetime, offers: Sequence[Offer]) -> list[Gauge]:
    """One per loaded policy with a monthly budget: spent so far and projected to the month's
    end (the live attempts at their pools' current prices), as the launch check reckons."""
    out = []
    for name, loaded in sorted(state.policies.snapshot().items()):
        cap = loaded.policy.budget
        if cap.monthly_usd is None:
            continue
        spend = job_budget.committed(state.store, name, now, offers)
        projected = budget.projected(spend, 0.0, now, cap.hours_per_month)
        out.append(
            Gauge(name, float(cap.monthly_usd), spend.spent_usd, projected, spend.live_attempts)
        )
    return out


def live_jobs(state: ApiState, offers: Sequence[Offer]) -> list[LiveJob]:
    jobs = state.store.jobs.live_jobs()
    attempts = state.store.jobs.attempts_of(j.id for j in jobs)
    gpu = state.store.telemetry.live_jobs_latest()
    prices = latest_prices(offers)
    out = []
    for job in sorted(jobs, key=lambda j: j.id, reverse=True):
        mine = attempts.get(job.id) or []
        current = mine[-1] if mine else None
        price = None
        if current is not None:
            price = prices.get(current.pool, current.usd_per_hour)
        out.append(LiveJob(job, current, price, gpu.get(job.name)))
    return out


def recent_alerts(state: ApiState, limit: int = RECENT_ALERTS) -> list[EventRecord]:
    """The newest events of warning severity or worse (what the alert routes exist for)."""
    found = state.store.events.list_events(limit=200)
    return [e for e in found if e.severity in ALERT_SEVERITIES][:limit]


def replicas(state: ApiState, now: datetime) -> tuple[list[Replica], str | None]:
    rows = state.store.replicas.seen(since=now - STALE_AFTER)
    alive_s = MISSED_BEATS * HEARTBEAT_S
    out = [Replica(r, (now - r.heartbeat_at).total_seconds() <= alive_s) for r in rows]
    leaders = [r.id for r in rows if r.role == "leader"]
    return out, leaders[0] if leaders else None


def overview(state: ApiState) -> Overview:
    now = state.clock()
    offers = state.store.prices.latest_offers()
    reps, leader = replicas(state, now)
    return Overview(
        now=now,
        month=month_to_date(state, now),
        gauges=gauges(state, now, offers),
        live=live_jobs(state, offers),
        alerts=recent_alerts(state),
        alert_counts=state.store.events.alert_counts(),
        replicas=reps,
        leader=leader,
        answered_by=state.extras.get("replica"),
    )
