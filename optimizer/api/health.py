"""Liveness and readiness: open to anyone (load balancers and probes carry no token)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from optimizer import __version__, answers
from optimizer.api.state import StateDep, utc_text

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=answers.Health)
def healthz(state: StateDep) -> dict[str, Any]:
    """The process is up and serving HTTP."""
    return {"status": "ok", "version": __version__, "started_at": utc_text(state.started_at)}


@router.get(
    "/readyz",
    response_model=answers.Ready,
    responses={503: {"model": answers.Ready, "description": "Not ready; `checks` says why."}},
)
def readyz(state: StateDep) -> JSONResponse:
    """Ready when the store answers, the loops are scheduled and every provider was polled."""
    ready, checks = state.ready()
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)
