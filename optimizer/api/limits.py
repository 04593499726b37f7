"""Request bodies over a size limit are refused with 413 before they are read.

A pure ASGI middleware, outside every handler: a `Content-Length` over the limit is answered
at once, without reading a byte of the body; a body sent without one (chunked) is counted as
it streams in and refused as soon as it passes the limit, so no handler ever holds more than
the limit in memory. A path under one of `larger`'s prefixes has that prefix's own limit
(code archives: `code.max_mib`) and its refusal names it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


@dataclass(frozen=True, slots=True)
class PathLimit:
    """Bodies sent to paths under `prefix` may be up to `max_bytes`; `detail` is the 413's."""

    prefix: str
    max_bytes: int
    detail: str


class BodyLimit:
    """413 for request bodies over `max_bytes` (docs/daemon.md: api.max_body_bytes), or over
    the limit of the `larger` prefix the path is under."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: Sequence[PathLimit] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.larger = tuple(larger)

    def _limit(self, path: str) -> tuple[int, str]:
        for rule in self.larger:
            if path.startswith(rule.prefix):
                return rule.max_bytes, rule.detail
        return self.max_bytes, f"request body over the limit of {self.max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, detail = self._limit(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > max_bytes:
            await self._refuse(send, detail)
            return
        seen = 0
        started = refused = False

        async def counted_receive() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    # Answer now; the app sees the client go away and whatever it answers
                    # after that is dropped.
                    refused = True
                    if not started:
                        await self._refuse(send, detail)
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted_receive, tracked_send)

    async def _refuse(self, send: Send, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        headers: list[Any] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
