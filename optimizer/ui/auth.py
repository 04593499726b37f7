"""Signing in to the console: `/ui/login` takes the daemon's API token and sets the session
cookie (HttpOnly, SameSite=Strict, Path=/ui, Secure when the request came over TLS, directly
or through a proxy uvicorn trusts); `/ui/logout` clears it. Wrong tokens count against the
client's address with the API's wrong bearer tokens (optimizer/api/throttle.py): a throttled
address gets 429 and the form again, whatever token it sent. Every other console page asks for
the cookie (`PageSession`: a page without it redirects to the login page; `DataSession`: a
data endpoint answers 401), and every form that changes something carries the session's
CSRF token (`check_csrf`)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import RedirectResponse, Response

from optimizer.api.auth import Outcome, check_token
from optimizer.api.gate import client_address
from optimizer.api.state import ApiState, StateDep
from optimizer.ui import session as sessions
from optimizer.ui.render import HEADERS, html
from optimizer.ui.session import Session

router = APIRouter(prefix="/ui", include_in_schema=False)

HOME = "/ui/"
MAX_FORM_BYTES = 16 * 1024


def current(request: Request, state: ApiState) -> Session | None:
    """The request's valid session, if any."""
    value = request.cookies.get(sessions.COOKIE)
    return sessions.verify(state.token.get_secret_value(), value, state.clock())


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a console path, never another site."""
    if not target or not target.startswith("/ui/") or "//" in target or "\\" in target:
        return HOME
    return target


def page_session(request: Request, state: StateDep) -> Session:
    found = current(request, state)
    if found is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(
            status.HTTP_303_SEE_OTHER,
            detail="sign in first",
            headers={"Location": f"/ui/login?next={quote(safe_next(target), safe='/')}"},
        )
    return found


def data_session(request: Request, state: StateDep) -> Session:
    found = current(request, state)
    if found is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="sign in to the console first")
    return found


PageSession = Annotated[Session, Depends(page_session)]
DataSession = Annotated[Session, Depends(data_session)]


async def form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first value of each)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(413, detail="form too large")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, detail="malformed form") from None
    return {k: v[0] for k, v in fields.items()}


def check_csrf(state: ApiState, session: Session, fields: dict[str, str]) -> None:
    """403 unless the form carries this session's CSRF token."""
    if not sessions.csrf_ok(state.token.get_secret_value(), session, fields.get("csrf")):
        raise HTTPException(
            403, detail="the form's CSRF token is missing or wrong: reload the page"
        )


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


@router.get("/login")
def login_page(request: Request, state: StateDep, next: str | None = None) -> Response:
    """The sign-in form (an already signed-in browser goes straight on)."""
    if current(request, state) is not None:
        return RedirectResponse(safe_next(next), status_code=303, headers=HEADERS)
    return html(request, "login.html", next=safe_next(next), error=None, title="Sign in")


@router.post("/login")
async def login(request: Request, state: StateDep) -> Response:
    """Check the token; right: set the session cookie and go on; wrong: the form again with
    an error, and no cookie."""
    fields = await form(request)
    given = fields.get("token", "").strip()
    target = safe_next(fields.get("next"))
    # An empty field counts as a wrong token: the form was sent, so it is a sign-in attempt.
    verdict = check_token(state, client_address(request.scope), given, missing_counts=True)
    if verdict.outcome is Outcome.THROTTLED:
        wait = verdict.retry_after_s
        answer = html(
            request,
            "login.html",
            status_code=429,
            next=target,
            error=f"Too many wrong tokens from your address: try again in {wait} s.",
            title="Sign in",
        )
        answer.headers["Retry-After"] = str(wait)
        return answer
    if verdict.outcome is not Outcome.PASSED:
        return html(
            request,
            "login.html",
            status_code=401,
            next=target,
            error="That is not the API token of this daemon.",
            title="Sign in",
        )
    value, _ = sessions.issue(state.token.get_secret_value(), state.clock())
    response = RedirectResponse(target, status_code=303, headers=HEADERS)
    response.set_cookie(
        sessions.COOKIE,
        value,
        max_age=sessions.LIFETIME_S,
        path=sessions.PATH,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )
    return response


@router.post("/logout")
async def logout(request: Request, state: StateDep, session: PageSession) -> Response:
    """Clear the cookie (the form carries the CSRF token, so no other site can sign you out)."""
    check_csrf(state, session, await form(request))
    response = RedirectResponse("/ui/login", status_code=303, headers=HEADERS)
    response.delete_cookie(
        sessions.COOKIE,
        path=sessions.PATH,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )
    return response
