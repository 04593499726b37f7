"""Console errors as pages: a console page that fails (an unknown job, an address with no page,
a refused form, a bad query parameter) answers its status with the console's frame around
what went wrong (the header, the navigation and a way back), not the API's JSON. The data
endpoints and fragments the pages' scripts fetch, the static files and every API path keep
the answers they had. `/favicon.ico`, which browsers ask for without being told, is the
console's icon, open like /ui/static/."""

from __future__ import annotations

from http import HTTPStatus
from inspect import isawaitable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from optimizer.ui import session as sessions
from optimizer.ui.auth import current
from optimizer.ui.render import html
from optimizer.ui.static_files import static

# What the pages' scripts fetch (they read the status themselves) and the static files.
NOT_PAGES = ("/ui/data/", "/ui/fragments/", "/ui/static/")
# A page's navigation item, by the first part of its path under /ui/.
NAV = {
    "": "overview",
    "jobs": "jobs",
    "offers": "offers",
    "prices": "prices",
    "policies": "policies",
}
ICON = "/favicon.ico"
MSG_CHARS = 300

icon_router = APIRouter(include_in_schema=False)


@icon_router.get(ICON)
def favicon() -> Response:
    """The console's icon where a browser looks for one by itself (no session needed)."""
    return static("favicon.svg")


def is_page(path: str) -> bool:
    """Whether `path` is (or would be) one of the console's pages."""
    return (path == "/ui" or path.startswith("/ui/")) and not path.startswith(NOT_PAGES)


def _nav(path: str) -> str:
    first = path.removeprefix("/ui").strip("/").split("/", 1)[0]
    return NAV.get(first, "")


def _what(path: str, status: int, detail: Any) -> str:
    if status == 404 and detail == HTTPStatus.NOT_FOUND.phrase:  # no route: Starlette's words
        return f"There is no console page at {path}."
    if isinstance(detail, str):
        return detail[0].upper() + detail[1:] + ("" if detail.endswith(".") else ".")
    return HTTPStatus(status).phrase + "."


def page(request: Request, status: int, what: str, problems: list[str] | None = None) -> Response:
    """The error page: the frame, `what` went wrong (and `problems`, one an item), `status`."""
    state = request.app.state.gpuopt
    session = current(request, state)
    csrf = sessions.csrf_token(state.token.get_secret_value(), session) if session else ""
    return html(
        request,
        "error.html",
        status_code=status,
        title=HTTPStatus(status).phrase,
        status=status,
        what=what,
        problems=problems or [],
        nav=_nav(request.url.path),
        csrf=csrf,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code < 400 or not is_page(request.url.path):
        return await http_exception_handler(request, exc)
    answer = page(request, exc.status_code, _what(request.url.path, exc.status_code, exc.detail))
    for name, value in (exc.headers or {}).items():
        answer.headers[name] = value
    return answer


def install(app: FastAPI) -> None:
    """Answer the console's pages' errors with pages; everything else as before."""
    previous = app.exception_handlers.get(RequestValidationError)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        if not is_page(request.url.path) or request.method != "GET":
            answer = (previous or request_validation_exception_handler)(request, exc)
            return await answer if isawaitable(answer) else answer
        problems = [
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: "
            + str(e.get("msg", ""))[:MSG_CHARS]
            for e in exc.errors()
        ]
        return page(request, 422, "The address has a parameter this page cannot use:", problems)

    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, invalid)
