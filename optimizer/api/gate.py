"""Authentication before anything of a request is read: an ASGI middleware in front of the
app. Open paths (`/healthz`, `/readyz`, `/metrics`) pass; `/agent/` paths need some attempt's
agent token; every other path (`/openapi.json` and `/docs` included) needs the daemon's
token, but for prefixes whose router checks its callers itself (`own_auth`: the web
console's `/ui/`, by its session cookie). A request without the right one is answered 401
before its body is read or parsed.
The handlers' own checks (require_token, the agent's attempt check) still run after it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Collection

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from optimizer.api.agent import known_agent
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
        if path.startswith(AGENT_PREFIX):
            allowed = await run_in_threadpool(known_agent, self.state, authorization)
            detail, challenge = "invalid agent token", b"Bearer"
        else:
            allowed = self._operator(authorization)
            detail, challenge = "missing or wrong bearer token", b'Bearer realm="gpuopt"'
        if allowed:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", challenge),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _operator(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        expected = self.state.token.get_secret_value().encode()
        return hmac.compare_digest(token.strip().encode(), expected)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None
