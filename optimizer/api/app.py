"""The FastAPI app: `create_app(state)`.

Routers by area, one module each. `/healthz`, `/readyz` and `/metrics` are open; every other
router in PROTECTED needs the daemon's bearer token, as do `/openapi.json` and `/docs` (a
page of the package's own: nothing from a CDN). The gate (`gate.py`) checks tokens before
anything of a request is read, and bodies over the limit (`limits.py`) get 413 unread.
While the database cannot be reached, a request that needs it gets 503 with Retry-After
(`unavailable.py`). Query parameters many routes share (times, offsets, page sizes) are
typed once, with their bounds, in `params.py`.
To add an area, write a module with a
`router = APIRouter(prefix=..., tags=[...])` whose handlers take `state: StateDep`, then add
it to PROTECTED, or pass it in `routers=` with the dependencies it needs (the agent's
endpoints authenticate with per-instance tokens instead of the daemon's).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse

from optimizer import __version__
from optimizer.api import (
    code,
    costs,
    events,
    health,
    jobs,
    logs,
    machines,
    metrics,
    offers,
    plan,
    policies,
    prices,
    probes,
    replicas,
)
from optimizer.api.auth import require_token
from optimizer.api.gate import AuthGate
from optimizer.api.limits import BodyLimit
from optimizer.api.state import ApiState
from optimizer.api.unavailable import StoreUnavailable

OPEN: tuple[APIRouter, ...] = (health.router, metrics.router)
PROTECTED: tuple[APIRouter, ...] = (
    offers.router,
    prices.router,
    policies.router,
    plan.router,
    jobs.router,
    logs.router,
    events.router,
    replicas.router,
    costs.router,
    probes.router,
    code.router,
    machines.router,
)
MAX_BODY_BYTES = 1 << 20  # api.max_body_bytes's default
_MSG_CHARS = 300


def create_app(
    state: ApiState,
    *,
    routers: Sequence[tuple[APIRouter, Sequence[Any]]] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    max_code_bytes: int = code.MAX_BYTES,
    own_auth: Sequence[str] = (),
) -> FastAPI:
    """The API over `state`; `routers` adds (router, dependencies) pairs after the built-in
    areas (behind the daemon's token unless under /agent/, which takes agent tokens, or
    under a prefix of `own_auth`, whose router checks its callers itself: the web console's
    session cookie). Request bodies over `max_body_bytes` are refused with 413 before they
    are read; code archives (`PUT /code/…`) over `max_code_bytes`."""
    app = FastAPI(
        title="gpuopt",
        version=__version__,
        summary="Keeps GPU work on the cheapest capacity a policy allows.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gpuopt = state
    for router in OPEN:
        app.include_router(router)
    for router in PROTECTED:
        app.include_router(router, dependencies=[Depends(require_token)])
    for router, dependencies in routers:
        app.include_router(router, dependencies=list(dependencies))
    _add_docs(app)
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    open_paths = {getattr(route, "path", "") for router in OPEN for route in router.routes}
    app.add_middleware(
        BodyLimit, max_bytes=max_body_bytes, larger=[code.body_limit(max_code_bytes)]
    )
    app.add_middleware(AuthGate, state=state, open_paths=open_paths, own_auth=tuple(own_auth))
    app.add_middleware(StoreUnavailable)  # outermost: the gate reads the store too
    return app


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each bad field and why, never echoing the submitted values."""
    detail = []
    for error in exc.errors():
        item: dict[str, Any] = {
            "loc": list(error.get("loc", ())),
            "msg": str(error.get("msg", ""))[:_MSG_CHARS],
            "type": error.get("type", ""),
        }
        detail.append(item)
    return JSONResponse({"detail": detail}, status_code=422)


def _add_docs(app: FastAPI) -> None:
    """`/openapi.json` and `/docs` behind the daemon's token like every other area. `/docs` is
    a page of the package's own (no script or style from a CDN, so it works offline): every
    endpoint with its summary, and the schema at `/openapi.json`."""
    docs = APIRouter(tags=["docs"], dependencies=[Depends(require_token)])

    @docs.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @docs.get("/docs", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(_docs_page(app.openapi()))

    app.include_router(docs)


def _docs_page(schema: dict[str, Any]) -> str:
    info = schema.get("info", {})
    title = html.escape(f"{info.get('title', 'API')} {info.get('version', '')}")
    rows = []
    for path, operations in sorted(schema.get("paths", {}).items()):
        for method, operation in operations.items():
            summary = operation.get("summary") or operation.get("description") or ""
            rows.append(
                f"<tr><td><code>{html.escape(method.upper())}</code></td>"
                f"<td><code>{html.escape(path)}</code></td>"
                f"<td>{html.escape(summary.splitlines()[0] if summary else '')}</td></tr>"
            )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{title}</title></head><body><h1>{title}</h1>"
        f"<p>{html.escape(info.get('summary', ''))}</p>"
        "<p>The OpenAPI schema is at <a href='openapi.json'>/openapi.json</a> (send the same "
        "bearer token). Every endpoint below but /healthz, /readyz and /metrics needs it.</p>"
        "<table><tr><th>Method</th><th>Path</th><th>Summary</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )
