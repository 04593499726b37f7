"""/offers: the latest stored offers, or one policy's ranking over them with rejections.

Both page like /jobs: `limit` (1-1000, default 100) per list. Offers are ordered by price and
rankings by rank, not by id, so the next page is asked for by position (`offset`) rather than
with `before`; the counts say how many there are in all.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from optimizer import answers
from optimizer.api.params import Offset, Page, Time
from optimizer.api.state import StateDep, utc_text
from optimizer.jobs.ranking import job_state, launch_ranking, with_expected
from optimizer.model import Market
from policies.schedule import effective, window_at

router = APIRouter(tags=["offers"])


@router.get("/offers", response_model=answers.OfferList | answers.RankingView)
def offers(
    state: StateDep,
    policy: Annotated[
        str | None, Query(description="Rank under this loaded policy, as a launch would.")
    ] = None,
    provider: Annotated[str | None, Query(description="Without a policy: this provider.")] = None,
    region: Annotated[str | None, Query(description="Without a policy: this region.")] = None,
    market: Annotated[Market | None, Query(description="Without a policy: this market.")] = None,
    limit: Annotated[Page, Query(description="At most this many offers (per list).")] = 100,
    offset: Annotated[
        Offset, Query(description="Skip this many first; the next page is offset + limit.")
    ] = 0,
    at: Annotated[
        Time | None,
        Query(
            description="With a policy: rank under the policy in force at this instant "
            "(ISO 8601 with a UTC offset, 1970 to 2200), the schedule window then; prices, "
            "cooldowns and spend are today's."
        ),
    ] = None,
    job: Annotated[
        str | None,
        Query(
            description="Rank as this job's next launch would: under its policy (the "
            "default), with what moving its checkpoint to each offer costs (data gravity)."
        ),
    ] = None,
) -> dict[str, Any]:
    """With `policy`: the ranking the next launch under it would walk (the latest offers of
    every provider less the pools in cooldown, with the policy's spend this month and live
    attempts for the budget rule): candidates best first, every rejection with its rule and
    reason, counts per rule. Without: the latest offers, cheapest first."""
    record = None
    if job is not None:
        record = state.store.jobs.get_job(job)
        if record is None:
            raise HTTPException(404, detail=f"no job named {job!r}")
        if policy is not None and policy != record.policy:
            raise HTTPException(
                422, detail=f"job {job} runs under policy {record.policy}, not {policy}"
            )
        policy = record.policy
    if policy is None:
        if at is not None:
            raise HTTPException(422, detail="at ranks under a policy: give policy too")
        count, rows = state.store.prices.cheapest_offers(
            provider=provider, region=region, market=market, limit=limit, offset=offset
        )
        return {"count": count, "offers": [o.to_dict() for o in rows]}
    if provider is not None or region is not None or market is not None:
        raise HTTPException(
            422, detail="provider, region and market filter the offers without a policy only"
        )
    if at is not None and at.utcoffset() is None:
        raise HTTPException(422, detail=f"at: {at.isoformat()} has no UTC offset; add one (Z)")
    loaded = state.policies.get(policy) if record is None else state.policies.for_job(record)
    if loaded is None:
        known = ", ".join(sorted(state.policies.snapshot())) or "none"
        raise HTTPException(404, detail=f"no policy named {policy!r} is loaded (loaded: {known})")
    now = state.clock()
    when = now if at is None else at
    window = window_at(loaded.policy.schedule, when)
    found = launch_ranking(
        state.store,
        policy,
        effective(loaded.policy, when),
        now,
        window=state.probe_window,
        replacing=None if record is None else record.id,
        state=None if record is None else job_state(state.store, record, now),
    )
    ranking = found.ranking
    stop = offset + limit
    return {
        "policy": ranking.policy_name,
        "evaluated_at": utc_text(ranking.evaluated_at),
        "at": utc_text(when),
        "window": None if window is None else window.name,
        "dtype": ranking.dtype,
        "candidate_count": len(ranking.candidates),
        "candidates": [c.to_dict() for c in _expected(state, policy, ranking, offset, stop)],
        "rejection_count": sum(ranking.rejection_counts().values()),
        "rejected_by_rule": ranking.rejection_counts(),
        "rejections": [r.to_dict() for r in ranking.rejections[offset:stop]],
        "cooling_down": found.held_back,
        "policy_status": loaded.status,
        "policy_sha256": loaded.sha256,
    }


def _expected(state: Any, policy: str, ranking: Any, offset: int, stop: int) -> list[Any]:
    """The page of candidates, each with its p, p's source and expected USD/h (a ranking by
    expected cost has them already)."""
    page = list(ranking.candidates[offset:stop])
    if page and page[0].expected_usd_per_hour is None:
        page = with_expected(state.store, policy, page, state.clock())
    return page
