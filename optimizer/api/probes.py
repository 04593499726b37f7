"""/probes: the probe results agents reported, newest first, with the figures the ranking reads
(docs/probes.md, "In the ranking"). Paged like /jobs: `before` is the last id of a page."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from optimizer import answers
from optimizer.api.params import Id, Page
from optimizer.api.state import StateDep

router = APIRouter(prefix="/probes", tags=["probes"])


@router.get("", response_model=answers.ProbeList)
def list_probes(
    state: StateDep,
    instance_type: Annotated[str | None, Query(max_length=200)] = None,
    provider: Annotated[str | None, Query(max_length=100)] = None,
    before: Annotated[Id | None, Query(description="Only results with an id below this.")] = None,
    limit: Annotated[Page, Query()] = 100,
) -> dict[str, Any]:
    """Probe results newest first, optionally of one instance type or provider."""
    found = state.store.probes.page(
        instance_type=instance_type, provider=provider, before_id=before, limit=limit
    )
    return {"probes": [p.to_dict() for p in found]}
