"""What a policy is committed to this month, gathered from the ledger for the budget model.

The model itself is `policies.budget` (pure, shared with the ranking's budget rule); this
module reads its inputs: the policy's month-to-date spend as the cost ledger prices it
(optimizer/jobs/ledger.py: frozen lines plus live attempts up to now, root volumes included),
and every live attempt at its pool's current price among the latest offers (its launch price
when the pool is no longer listed). The projection prices instances only.

A multi-node attempt is one attempt row per node (its own instance); its live rows are one
`Live` of as many instances, each at the pool's price, so a gang of N costs N instances and
is counted once as an attempt. The ledger's month-to-date spend bills each node's instance on
its own lines already, so nothing here adds to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from optimizer.jobs.gang import head_number
from optimizer.jobs.ledger import Ledger
from optimizer.jobs.offer_table import pool_rows
from optimizer.model import Offer, Pool
from optimizer.store import Store
from policies import budget
from policies.table import OfferTable


def committed(
    store: Store,
    policy: str,
    now: datetime,
    offers: OfferTable | Iterable[Offer],
    *,
    replacing: int | None = None,
) -> budget.Committed:
    """The policy's spend so far this month and its live attempts at their current prices.

    `replacing`: the id of a job about to launch its next attempt; its own live attempt (an
    interrupted one, still running out its notice) is being replaced by the new one, so it
    counts for what it has spent but not for the rest of the month. Its idle warm spare
    still counts: a relaunch does not end it.
    """
    start, end = budget.month_bounds(now)
    spent = Ledger(store).total(since=start, until=end, policy=policy, now=now).total_usd
    live = [
        a
        for a in store.jobs.policy_attempts(policy, start)
        # a job's idle warm spare is not replaced by its relaunch: it takes the job over or
        # stays, so it counts for the rest of the month (optimizer/jobs/spares.py)
        if a.ended_at is None and (a.job_id != replacing or a.idle_spare)
    ]
    wanted: set[Pool] = set()
    for a in live:
        provider, region, _zone, instance_type, market = a.pool
        wanted |= {a.pool, Pool(provider, region, None, instance_type, market)}
    prices = _current_prices(offers, wanted)
    by_attempt: dict[tuple[int, int], list[budget.Live]] = {}
    for a in live:
        provider, region, _zone, instance_type, market = a.pool
        regional = Pool(provider, region, None, instance_type, market)
        current = prices.get(a.pool, prices.get(regional))
        attempt = (a.job_id, head_number(a.number, a.gang))
        by_attempt.setdefault(attempt, []).append(budget.Live(a.usd_per_hour, current))
    return budget.committed(spent, [_one(nodes) for nodes in by_attempt.values()])


def _current_prices(offers: OfferTable | Iterable[Offer], pools: set[Pool]) -> dict[Pool, float]:
    """The cheapest offer's USD/h of each of `pools` that the offers price: a table is
    searched by its columns (the latest offers are 100k rows, the live attempts a few)."""
    prices: dict[Pool, float] = {}
    if not pools:
        return prices
    if isinstance(offers, OfferTable):
        usd = offers.number("usd_per_hour")
        for pool in pools:
            rows = pool_rows(offers, pool)
            if rows.any():
                prices[pool] = float(usd[rows].min())
        return prices
    for offer in offers:
        key = offer.pool
        if key in pools and offer.usd_per_hour < prices.get(key, float("inf")):
            prices[key] = offer.usd_per_hour
    return prices


def _one(nodes: list[budget.Live]) -> budget.Live:
    """A gang's live nodes as one attempt of as many instances (a single node as itself);
    the nodes of one gang share one offer, so one per-instance price stands for all."""
    if len(nodes) == 1:
        return nodes[0]
    each = sum(n.price for n in nodes) / len(nodes)
    return budget.Live(each, instances=len(nodes))
