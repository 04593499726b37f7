"""What keeps slow or numerous clients from taking the API server's sockets away from the rest
of the daemon: a header timeout, a connection cap, and accept errors logged at a bounded rate.

uvicorn's h11 protocol closes a keep-alive connection that stays idle between requests
(`timeout_keep_alive`), but it has no time limit on a request's headers: a client that
connects and never sends them, or sends them a byte at a time, holds its connection (a
file descriptor) for ever. `GuardedH11Protocol` closes such a connection once
`header_timeout_s` passes without a complete request line and headers (a 408), and refuses
connections beyond `max_connections` at once (a 503 and a close) instead of letting them
pile up until the process runs out of descriptors; the store, the loops and the logs need
descriptors of their own, so the cap is also kept `RESERVED_FDS` under the open-file limit,
and connections are accepted at most ACCEPT_BACKLOG at a time.
When accepting fails anyway (EMFILE and the like, asyncio retries a second later) the loop's
exception handler logs it at most `ThrottledLog.burst` times per `ThrottledLog.every_s`, with
a count of what it left out, instead of a traceback per attempt.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("gpuopt.api")

RESERVED_FDS = 128  # descriptors kept for the store, the loops, logs and child processes
# asyncio accepts up to `backlog` connections each time the socket is readable, and each
# holds a descriptor until its protocol runs (where the cap closes it): keep that burst well
# inside RESERVED_FDS. The listen queue gets the same length.
ACCEPT_BACKLOG = 64
MIN_CONNECTIONS = 8
# What accept(2) fails with when the process or the system is out of a resource.
ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_FULL_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: %d\r\n\r\n%s"
)


@dataclass(frozen=True)
class ConnectionLimits:
    """The API server's limits (docs/daemon.md: api.header_timeout_s, api.idle_timeout_s,
    api.max_connections)."""

    header_timeout_s: float = 10.0
    idle_timeout_s: float = 5.0
    max_connections: int = 1024


def connection_cap(configured: int, open_files: int | None) -> int:
    """`configured`, lowered to leave RESERVED_FDS of the soft open-file limit `open_files`
    (None: unlimited) to the rest of the daemon, and never under MIN_CONNECTIONS."""
    if open_files is None or open_files < 0:
        return configured
    return max(MIN_CONNECTIONS, min(configured, open_files - RESERVED_FDS))


def raise_open_file_limit(wanted: int = 65536) -> tuple[int, int]:
    """Raise this process's soft open-file limit towards `wanted`, within its hard limit (as
    Go programs do at start): where nothing else can set it (a Kubernetes pod) the daemon
    still gets what the runtime allows. Returns the soft limit (before, after); call it
    once, from the process's entry point (`gpuopt daemon`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return soft, soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target <= soft:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target


def open_file_limit() -> int | None:
    """The process's soft RLIMIT_NOFILE (None when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


@dataclass
class ThrottledLog:
    """At most `burst` records per window of `every_s` seconds; `allow()` says whether to
    log now and how many were left out since the last record that was let through."""

    every_s: float = 10.0
    burst: int = 3
    clock: Callable[[], float] = time.monotonic
    _window_start: float | None = field(default=None, init=False)
    _in_window: int = field(default=0, init=False)
    _suppressed: int = field(default=0, init=False)

    def allow(self) -> tuple[bool, int]:
        now = self.clock()
        if self._window_start is None or now - self._window_start >= self.every_s:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.burst:
            self._suppressed += 1
            return False, 0
        self._in_window += 1
        suppressed, self._suppressed = self._suppressed, 0
        return True, suppressed


class AcceptErrorHandler:
    """An event loop exception handler: accept errors (out of descriptors, of memory) are
    logged through a ThrottledLog as one line each; everything else goes to the loop's
    default handler."""

    def __init__(self, throttle: ThrottledLog | None = None) -> None:
        self.throttle = throttle or ThrottledLog()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in ACCEPT_ERRNOS):
            loop.default_exception_handler(context)
            return
        allowed, suppressed = self.throttle.allow()
        if not allowed:
            return
        more = f" ({suppressed} more like it not logged)" if suppressed else ""
        log.warning(
            "the API cannot accept connections: %s; it tries again in a second%s",
            exc.strerror or exc,
            more,
        )


class GuardedConfig(uvicorn.Config):
    """uvicorn's Config with the limits GuardedH11Protocol reads."""

    def __init__(self, app: Any, *, limits: ConnectionLimits, max_connections: int, **kw: Any):
        super().__init__(
            app,
            http=GuardedH11Protocol,
            backlog=ACCEPT_BACKLOG,
            # Typed int, used as call_later's delay: a fraction of a second works.
            timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]
            **kw,
        )
        self.limits = limits
        self.max_connections = max_connections


class GuardedServer(uvicorn.Server):
    """uvicorn's Server with accept errors logged through an AcceptErrorHandler."""

    def __init__(self, config: GuardedConfig, handler: AcceptErrorHandler | None = None) -> None:
        super().__init__(config)
        self.accept_errors = handler or AcceptErrorHandler()

    async def serve(self, sockets: Any = None) -> None:
        asyncio.get_running_loop().set_exception_handler(self.accept_errors)
        await super().serve(sockets)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a time limit on each request's headers and a cap on open
    connections (the config must be a GuardedConfig)."""

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        config = self.config
        assert isinstance(config, GuardedConfig)
        if len(self.connections) >= config.max_connections:
            # Not added to `connections`: closed before a byte of the request is read.
            self.transport = transport
            body = (
                f"the daemon holds its limit of {config.max_connections} connections "
                "(api.max_connections); try again shortly\n"
            ).encode()
            transport.write(_FULL_503 % (len(body), body))
            transport.close()
            return
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        # The first bytes of a keep-alive connection's next request start its header clock.
        if self._header_timer is None and self._awaiting_request():
            self._arm_header_timer()
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_timer is not None and not self._awaiting_request():
            self._disarm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _awaiting_request(self) -> bool:
        """Whether the connection waits for (the rest of) a request's line and headers."""
        if self.transport is None or self.transport.is_closing():
            return False
        return self.conn.their_state is h11.IDLE and (
            self.cycle is None or self.cycle.response_complete
        )

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        config = self.config
        assert isinstance(config, GuardedConfig)
        self._header_timer = self.loop.call_later(
            config.limits.header_timeout_s, self._headers_timed_out
        )

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if not self._awaiting_request():
            return
        body = b"the request's headers did not arrive in time (api.header_timeout_s)\n"
        self.transport.write(_TIMEOUT_408 % (len(body), body))
        self.transport.close()
