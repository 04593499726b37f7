"""/offers: the latest stored offers, or one policy's ranking over them with rejections."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from optimizer.api.state import StateDep
from optimizer.jobs import budget
from optimizer.model import Market
from policies.engine import evaluate

router = APIRouter(tags=["offers"])


@router.get("/offers")
def offers(
    state: StateDep,
    policy: Annotated[str | None, Query(description="Rank under this loaded policy.")] = None,
    provider: Annotated[str | None, Query(description="Without a policy: this provider.")] = None,
    region: Annotated[str | None, Query(description="Without a policy: this region.")] = None,
    market: Annotated[Market | None, Query(description="Without a policy: this market.")] = None,
    limit: Annotated[
        int, Query(ge=0, description="At most this many candidates/rejections/offers (0 = all).")
    ] = 0,
) -> dict[str, Any]:
    """With `policy`: the engine's ranking (candidates best first, every rejection with its
    rule and reason, counts per rule) over the latest offers of every provider. Without:
    the latest offers, cheapest first."""
    if policy is None:
        rows = state.store.prices.latest_offers(provider=provider, region=region, market=market)
        rows.sort(key=lambda o: (o.usd_per_hour, o.pool))
        shown = rows[:limit] if limit else rows
        return {"count": len(rows), "offers": [o.to_dict() for o in shown]}
    loaded = state.policies.get(policy)
    if loaded is None:
        known = ", ".join(sorted(state.policies.snapshot())) or "none"
        raise HTTPException(404, detail=f"no policy named {policy!r} is loaded (loaded: {known})")
    offers, now = state.store.prices.latest_offers(), state.clock()
    spend = None
    if loaded.policy.budget.monthly_usd is not None:
        spend = budget.committed(state.store, policy, now, offers)
    ranking = evaluate(loaded.policy, offers, now, committed=spend)
    out = ranking.to_dict()
    if limit:
        out["candidates"] = out["candidates"][:limit]
        out["rejections"] = out["rejections"][:limit]
    out["policy_status"] = loaded.status
    return out
