"""Prometheus exposition, open like /healthz (scrapers carry no token)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from optimizer.api.state import StateDep
from optimizer.daemon.metrics import CONTENT_TYPE

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def metrics(state: StateDep) -> Response:
    """Poll times and errors per provider and region, offers, jobs by state, alerts, loops."""
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
