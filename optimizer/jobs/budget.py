"""What a policy is committed to this month, gathered from the ledger for the budget model.

The model itself is `policies.budget` (pure, shared with the ranking's budget rule); this
module reads its inputs: the policy's month-to-date spend as the cost ledger prices it
(optimizer/jobs/ledger.py: frozen lines plus live attempts up to now, root volumes included),
and every live attempt at its pool's current price among the latest offers (its launch price
when the pool is no longer listed). The projection prices instances only.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from optimizer.jobs.ledger import Ledger
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
    start, end = budget.month_bounds(now)
    spent = Ledger(store).total(since=start, until=end, policy=policy, now=now).total_usd
    live = []
    for a in store.jobs.policy_attempts(policy, start):
        if a.ended_at is not None or a.job_id == replacing:
            continue
        provider, region, _zone, instance_type, market = a.pool
        current = prices.get(a.pool, prices.get((provider, region, None, instance_type, market)))
        live.append(budget.Live(a.usd_per_hour, current))
    return budget.committed(spent, live)
