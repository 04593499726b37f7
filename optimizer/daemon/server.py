"""The API's HTTP server: uvicorn's `Server` on a thread of its own.

The socket is bound on the caller's thread first (the daemon does it before it touches its
store or data directory), so a taken port or a bad address fails `gpuopt daemon` at once
with one line and nothing created, and port 0 gives a free port that `port` reports.
uvicorn installs no signal handlers off the main thread; the daemon owns SIGTERM/SIGINT and
stops the server by setting `should_exit` (in-flight requests get a few seconds to finish).
Slow and numerous clients are kept in bounds by `connections.py` (a header timeout, an idle
timeout, a connection cap under the open-file limit, accept errors logged at a bounded rate).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from typing import Any

from optimizer.daemon.connections import (
    ACCEPT_BACKLOG,
    ConnectionLimits,
    GuardedConfig,
    GuardedServer,
    connection_cap,
    open_file_limit,
)

START_TIMEOUT_S = 10.0
GRACEFUL_S = 5

log = logging.getLogger("gpuopt.api")


class BindError(RuntimeError):
    """The API could not listen where it was asked to."""


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1: addresses other machines cannot reach."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiServer:
    """Serves an ASGI app on (host, port) from a background thread: `bind()` the socket,
    then `start(app)`."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        access_log: bool = False,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.access_log = access_log
        self.limits = limits or ConnectionLimits()
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._server: GuardedServer | None = None

    def bind(self) -> None:
        """Open the listening socket; raises BindError with a one-line reason."""
        try:
            infos = socket.getaddrinfo(
                self.host, self.requested_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except socket.gaierror as exc:
            raise BindError(f"cannot resolve API host {self.host!r}: {exc.strerror}") from None
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(ACCEPT_BACKLOG)
        except OSError as exc:
            sock.close()
            where = f"{self.host}:{self.requested_port}"
            raise BindError(f"cannot listen on {where}: {exc.strerror or exc}") from None
        sock.setblocking(False)
        self._socket = sock

    @property
    def port(self) -> int:
        if self._socket is None:
            return self.requested_port
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self, app: Any) -> None:
        """Serve `app` on a thread; returns once the server accepts connections."""
        if self._socket is None:
            self.bind()
        server = self._server = GuardedServer(
            GuardedConfig(
                app,
                limits=self.limits,
                max_connections=self.max_connections(),
                log_config=None,
                access_log=self.access_log,
                lifespan="off",
                # The API has no WebSocket route; "auto" would import whichever WebSocket
                # library happens to be installed (wsproto, websockets) into every daemon.
                ws="none",
                server_header=False,
                timeout_graceful_shutdown=GRACEFUL_S,
            )
        )
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [self._socket]}, name="gpuopt-api", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive():
                raise BindError("the API server stopped while starting (see the log)")
            if time.monotonic() > deadline:
                raise BindError(f"the API server did not start within {START_TIMEOUT_S:.0f}s")
            time.sleep(0.01)

    def max_connections(self) -> int:
        """api.max_connections, lowered (with a warning) to fit the open-file limit."""
        configured = self.limits.max_connections
        limit = open_file_limit()
        cap = connection_cap(configured, limit)
        if cap < configured:
            log.warning(
                "api.max_connections lowered from %d to %d: the open-file limit is %d "
                "(raise it, e.g. LimitNOFILE= in the systemd unit)",
                configured,
                cap,
                limit,
            )
        return cap

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = GRACEFUL_S + 5) -> None:
        """Stop serving (requests in flight get GRACEFUL_S) and close the socket."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        """Close the listening socket (a server that never started holds nothing else)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
