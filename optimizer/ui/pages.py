"""The console's pages and the data endpoints their scripts poll, all behind the session
cookie (auth.py). Pages are rendered on the server; a page's live part is a fragment that
console.js fetches again every few seconds (`data-refresh`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from optimizer.api.state import StateDep
from optimizer.ui import session as sessions
from optimizer.ui.auth import DataSession, PageSession
from optimizer.ui.overview import overview
from optimizer.ui.render import html

router = APIRouter(prefix="/ui", include_in_schema=False)

REFRESH_MS = 3000  # the live parts' polling period: within the issue's 5 s


def _common(state: StateDep, session: sessions.Session, nav: str) -> dict[str, Any]:
    return {
        "csrf": sessions.csrf_token(state.token.get_secret_value(), session),
        "nav": nav,
        "refresh_ms": REFRESH_MS,
    }


@router.get("/")
async def overview_page(request: Request, state: StateDep, session: PageSession) -> HTMLResponse:
    data = await run_in_threadpool(overview, state)
    return html(
        request, "overview.html", o=data, title="Overview", **_common(state, session, "overview")
    )


@router.get("/fragments/overview")
async def overview_fragment(request: Request, state: StateDep, _: DataSession) -> HTMLResponse:
    data = await run_in_threadpool(overview, state)
    return html(request, "_overview.html", o=data)
