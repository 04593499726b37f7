"""What a policy is committed to this month, gathered from the store for the budget model.

The model itself is `policies.budget` (pure, shared with the ranking's budget rule); this
module reads its inputs: the policy's attempts this month, and the current price of each live
attempt's pool among the latest offers (its launch price when the pool is no longer listed).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from optimizer.model import Offer
from optimizer.store import Store
from policies import budget


def committed(
    store: Store,
    policy: str,
    now: datetime,
    offers: Iterable[Offer],
    *,
    replacing: int | None = None,
) -> budget.Committed:
    """The policy's spend so far this month and its live attempts at their current prices.

    `replacing`: the id of a job about to launch its next attempt; its own live attempt (an
    interrupted one, still running out its notice) is being replaced by the new one, so it
    counts for what it has spent but not for the rest of the month.
    """
    prices: dict[tuple[str, str, str | None, str, str], float] = {}
    for offer in offers:
        pool = (offer.provider, offer.region, offer.zone, offer.instance_type, offer.market.value)
        if offer.usd_per_hour < prices.get(pool, float("inf")):
            prices[pool] = offer.usd_per_hour
    start, _ = budget.month_bounds(now)
    spends = []
    for a in store.jobs.policy_attempts(policy, start):
        ended = a.ended_at
        if ended is None and a.job_id == replacing:
            ended = now
        provider, region, _zone, instance_type, market = a.pool
        current = prices.get(a.pool, prices.get((provider, region, None, instance_type, market)))
        spends.append(budget.Spend(a.started_at, ended, a.usd_per_hour, current))
    return budget.committed(spends, now)
