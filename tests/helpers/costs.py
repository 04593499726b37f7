"""Attempts and price history for the cost ledger's tests, written straight to a store.

`attempt` records a job's attempt on the BASE pool (AWS spot g5.xlarge in use1-az1, launched
at $0.40/h) with its instance's launch, and optionally its job's start and exit; `ended` is
the row of an attempt gpuopt ended with the provider's termination reported; `observe`
records one price point of a pool.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from optimizer.store import Store
from tests.helpers.offers import make_offer

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def observe(store: Store, when: datetime, usd: float, **pool: Any) -> None:
    store.prices.record_offers([make_offer(observed_at=when, usd_per_hour=usd, **pool)])


def attempt(
    store: Store,
    job: str,
    number: int = 1,
    *,
    policy: str = "team",
    launched: datetime = T0,
    job_started: datetime | None = None,
    job_exited: datetime | None = None,
    **values: Any,
) -> str:
    """A job's attempt on the BASE pool (AWS spot g5.xlarge, use1-az1, launched at $0.40/h)
    with its instance launched at `launched`; `values` set the rest of the attempt's row."""
    found = store.jobs.get_job(job)
    job_id = found.id if found else store.jobs.add_job(job, policy, {"run": "x"}, at=launched)
    pool = {k: values.pop(k) for k in ("market", "zone", "usd_per_hour") if k in values}
    key = f"{job}-{number}"
    offer = make_offer(observed_at=launched, **pool)
    store.jobs.create_attempt(job_id, number, key, offer, "sha", launched - timedelta(minutes=2))
    store.jobs.update_attempt(
        key, instance_id=f"i-{key}", launched_at=launched, job_started_at=job_started, **values
    )
    if job_exited is not None:
        event = {"id": f"{key}-exit", "kind": "job_exited", "at": job_exited.isoformat()}
        store.jobs.record_agent_events(key, [{**event, "data": {"exit_code": 0}}], job_exited)
    return key


def ended(minutes: float, by: str = "gpuopt") -> dict[str, Any]:
    """An attempt's end: gpuopt ended it then, and the provider reports the termination."""
    return {
        "ended_at": at(minutes),
        "state": "ended",
        "instance_gone": True,
        "terminated_at": at(minutes),
        "terminated_by": by,
    }
