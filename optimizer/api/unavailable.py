"""503, not 500, while the database cannot be reached: an ASGI middleware outside every other.

A request that finds the database gone (PostgreSQL restarting or unreachable, SQLite's file
locked past its busy timeout, the pool empty past its timeout) is answered 503 with
`Retry-After`, whether the gate (an agent's token is looked up in the store) or a handler
met it. Clients retry a 503 after the pause; a 500 says the request itself is at fault.
The database's own message is logged, never answered: it can name hosts and users.
"""

from __future__ import annotations

import json
import logging

from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
UNAVAILABLE = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)
DETAIL = "the database is unavailable; try again shortly"


class StoreUnavailable:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except UNAVAILABLE as exc:
            if started:  # a stream already under way: nothing but ending it is left
                raise
            log.warning(
                "%s %s: %s; answered 503 (%s)",
                scope.get("method", ""),
                scope.get("path", ""),
                DETAIL,
                _first_line(exc),
            )
            await _answer(send)


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"


async def _answer(send: Send) -> None:
    body = json.dumps({"detail": DETAIL}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_S).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
