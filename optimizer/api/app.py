"""The FastAPI app: `create_app(state)`.

Routers by area, one module each. `/healthz`, `/readyz` and `/metrics` are open; every other
router in PROTECTED needs the daemon's bearer token. To add an area, write a module with a
`router = APIRouter(prefix=..., tags=[...])` whose handlers take `state: StateDep`, then add
it to PROTECTED, or pass it in `routers=` with the dependencies it needs (the agent's
endpoints authenticate with per-instance tokens instead of the daemon's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI

from optimizer import __version__
from optimizer.api import events, health, jobs, metrics, offers, policies, replicas
from optimizer.api.auth import require_token
from optimizer.api.state import ApiState

OPEN: tuple[APIRouter, ...] = (health.router, metrics.router)
PROTECTED: tuple[APIRouter, ...] = (
    offers.router,
    policies.router,
    jobs.router,
    events.router,
    replicas.router,
)


def create_app(
    state: ApiState, *, routers: Sequence[tuple[APIRouter, Sequence[Any]]] = ()
) -> FastAPI:
    """The API over `state`; `routers` adds (router, dependencies) pairs after the built-in
    areas."""
    app = FastAPI(
        title="gpuopt",
        version=__version__,
        summary="Keeps GPU work on the cheapest capacity a policy allows.",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.gpuopt = state
    for router in OPEN:
        app.include_router(router)
    for router in PROTECTED:
        app.include_router(router, dependencies=[Depends(require_token)])
    for router, dependencies in routers:
        app.include_router(router, dependencies=list(dependencies))
    return app
