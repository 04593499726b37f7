"""/prices/history: one pool's price points in effect, oldest first, across both tiers of
price history (raw points, and hourly summaries past the raw retention)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from optimizer import answers
from optimizer.api.params import Time, bad_query
from optimizer.api.state import StateDep, utc_text
from optimizer.model import Market
from optimizer.store import PricePoint
from providers import registry

router = APIRouter(prefix="/prices", tags=["prices"])

MAX_POINTS = 10_000
DEFAULT_POINTS = 1_000


def point_view(point: PricePoint) -> dict[str, Any]:
    return {
        "at": utc_text(point.at),
        "tier": point.tier.value,
        "usd_per_hour": point.usd_per_hour,
        "min_usd": point.min_usd,
        "max_usd": point.max_usd,
        "points": point.points,
    }


def _utc(value: datetime | None) -> datetime | None:
    """Times without an offset are UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _page(points: list[PricePoint], limit: int) -> tuple[list[PricePoint], datetime | None]:
    """The first `limit` points and where the next page starts (None: no more). The cut
    never splits the points of one instant across pages; should one instant hold more
    points than a page, the page holds what was read of them and paging ends there."""
    if len(points) <= limit:
        return points, None
    next_at = points[limit].at
    kept = [p for p in points[:limit] if p.at < next_at]
    if not kept:  # more points at one instant than a page holds: give them all
        kept = [p for p in points if p.at == next_at]
        later = [p for p in points if p.at > next_at]
        return kept, later[0].at if later else None
    return kept, next_at


@router.get("/history", response_model=answers.PriceHistory)
def price_history(
    state: StateDep,
    provider: Annotated[str, Query(min_length=1, description="The pool's provider.")],
    region: Annotated[str, Query(min_length=1, description="The pool's region.")],
    instance_type: Annotated[str, Query(min_length=1, description="The instance type.")],
    zone: Annotated[
        str | None, Query(description="The pool's zone; none for a pool priced per region.")
    ] = None,
    market: Annotated[Market, Query(description="spot or on_demand.")] = Market.SPOT,
    since: Annotated[
        Time | None, Query(description="ISO 8601, 1970 to 2200; without an offset, UTC.")
    ] = None,
    until: Annotated[
        Time | None,
        Query(description="ISO 8601, 1970 to 2200, exclusive; without an offset, UTC."),
    ] = None,
    prior: Annotated[
        bool, Query(description="With since: first the point in effect at since.")
    ] = True,
    limit: Annotated[int, Query(ge=1, le=MAX_POINTS, description="Points per page.")] = (
        DEFAULT_POINTS
    ),
) -> dict[str, Any]:
    """A pool's points in effect over [since, until), oldest first: raw observations where
    they are kept, and past the raw retention one point per hour at the hour's median
    (`tier` says which; min, max and the number of points summarized come with it). With
    `since` (and `prior`, the default), the first point is the last one before `since`: the
    price in effect at `since`. When more points remain, `next_since` is where the next page
    starts: ask again with `since=<next_since>&prior=false`."""
    if registry.find(provider) is None:
        known = ", ".join(registry.names())
        raise bad_query("provider", f"unknown provider {provider!r}; known: {known}")
    start, end = _utc(since), _utc(until)
    if start is not None and end is not None and end <= start:
        raise bad_query("until", "must be later than since")
    found = state.store.prices.price_points(
        provider, region, zone, instance_type, market, start, end, prior=prior, limit=limit + 1
    )
    before = [p for p in found if start is not None and p.at < start]
    shown, next_at = _page(found[len(before) :], limit)
    return {
        "provider": provider,
        "region": region,
        "zone": zone or None,
        "instance_type": instance_type,
        "market": market.value,
        "since": utc_text(start),
        "until": utc_text(end),
        "count": len(before) + len(shown),
        "points": [point_view(p) for p in before + shown],
        "next_since": utc_text(next_at),
    }
