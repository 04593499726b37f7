"""Authentication before anything of a request is read: an ASGI middleware in front of the
app. Open paths (`/healthz`, `/readyz`, `/metrics`) pass; `/agent/` paths need some attempt's
agent token; every other path (`/openapi.json` and `/docs` included) needs the daemon's
token, but for prefixes whose router checks its callers itself (`own_auth`: the web
console's `/ui/`, by its session cookie). A request without the right one is answered 401
before its body is read or parsed; a wrong operator token is counted against the client's
address, and an address with too many is answered 429 with Retry-After, whatever token it
sends, until it may try again (`optimizer.api.auth.check_token`).
The handlers' own checks (require_token, the agent's attempt check) still run after it.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from optimizer.api.agent import known_agent
from optimizer.api.auth import Outcome, check_token
from optimizer.api.state import ApiState

AGENT_PREFIX = "/agent/"


class AuthGate:
    def __init__(
        self,
        app: ASGIApp,
        state: ApiState,
        open_paths: Collection[str],
        own_auth: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.state = state
        self.open_paths = frozenset(open_paths)
        self.own_auth = own_auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or path in self.open_paths
            or any(path.startswith(p) or path == p.rstrip("/") for p in self.own_auth)
        ):
            await self.app(scope, receive, send)
            return
        authorization = _header(scope, b"authorization")
        status, extra = 401, []
        if path.startswith(AGENT_PREFIX):
            allowed = await run_in_threadpool(known_agent, self.state, authorization)
            detail, challenge = "invalid agent token", b"Bearer"
        else:
            verdict = check_token(self.state, client_address(scope), _bearer(authorization))
            allowed = verdict.outcome is Outcome.PASSED
            detail, challenge = "missing or wrong bearer token", b'Bearer realm="gpuopt"'
            if verdict.outcome is Outcome.THROTTLED:
                wait = verdict.retry_after_s
                status, extra = 429, [(b"retry-after", str(wait).encode())]
                detail = f"too many wrong tokens from this address: try again in {wait} s"
        if allowed:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", challenge),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None without one."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def client_address(scope: Scope) -> str:
    """The address wrong tokens are counted against: the peer's, or the one that a proxy
    uvicorn trusts (`--forwarded-allow-ips`) put in X-Forwarded-For."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None
