"""Slow and numerous clients against a real daemon on loopback: connections that never finish
their headers are closed after api.header_timeout_s while other requests are answered,
connections beyond api.max_connections are refused at once, an idle keep-alive connection
is closed after api.idle_timeout_s, and accept errors are logged at a bounded rate."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from optimizer.daemon.config import DaemonConfig
from optimizer.daemon.connections import (
    MIN_CONNECTIONS,
    RESERVED_FDS,
    AcceptErrorHandler,
    ThrottledLog,
    connection_cap,
)
from optimizer.daemon.service import Daemon
from tests.helpers import TOKEN, api, make_config, running, wait_until

pytestmark = pytest.mark.usefixtures("daemon_env")

PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: gpuopt\r\nX-Slow: "  # never finished


def address(daemon: Daemon) -> tuple[str, int]:
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def connect(daemon: Daemon, stack: ExitStack, first: bytes = b"") -> socket.socket:
    conn = stack.enter_context(socket.create_connection(address(daemon), timeout=10))
    if first:
        conn.sendall(first)
    return conn


def closed_by_server(conn: socket.socket, within: float = 15.0) -> bytes | None:
    """What the server sent before it closed `conn` (None if it did not close it by then)."""
    deadline = time.monotonic() + within
    got = b""
    while time.monotonic() < deadline:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = conn.recv(4096)
        except TimeoutError:
            return None
        except ConnectionResetError:
            return got
        if not data:
            return got
        got += data
    return None


@pytest.fixture
def short_headers(tmp_path: Path) -> Iterator[Daemon]:
    config = make_config(tmp_path, api={"header_timeout_s": 0.5, "idle_timeout_s": 0.5})
    with running(config) as daemon:
        yield daemon


def test_connections_that_never_finish_their_headers_are_closed_while_others_are_answered(
    short_headers: Daemon,
) -> None:
    daemon = short_headers
    with ExitStack() as stack:
        silent = [connect(daemon, stack) for _ in range(5)]  # connect and send nothing
        slow = [connect(daemon, stack, PARTIAL) for _ in range(20)]
        with api(daemon) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/jobs").status_code == 200
        for conn in silent + slow:
            answer = closed_by_server(conn)
            assert answer is not None, "a connection without headers was kept open"
            assert answer.startswith(b"HTTP/1.1 408 ")
            assert b"api.header_timeout_s" in answer


def test_headers_sent_a_byte_at_a_time_do_not_keep_the_connection(short_headers: Daemon) -> None:
    with ExitStack() as stack:
        conn = connect(short_headers, stack, b"G")
        deadline = time.monotonic() + 15
        answer = b""
        for byte in PARTIAL[1:] * 1000:
            if time.monotonic() > deadline:
                pytest.fail("a client sending its headers a byte at a time was kept open")
            try:
                conn.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            conn.settimeout(0.02)
            try:
                data = conn.recv(4096)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            answer += data
            if not data or answer.endswith(b"\n"):
                break
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408 ")


def test_a_keep_alive_connection_is_closed_once_idle_and_not_while_answered(
    short_headers: Daemon,
) -> None:
    with ExitStack() as stack:
        conn = connect(short_headers, stack, b"GET /healthz HTTP/1.1\r\nHost: gpuopt\r\n\r\n")
        answer = closed_by_server(conn)
        assert answer is not None and answer.startswith(b"HTTP/1.1 200 ")
        assert b"408" not in answer  # closed as idle after its answer, not as a slow request


def test_connections_beyond_the_cap_are_refused_at_once_and_a_freed_slot_is_usable(
    tmp_path: Path,
) -> None:
    cap = MIN_CONNECTIONS
    config = make_config(tmp_path, api={"max_connections": cap, "header_timeout_s": 60})
    with running(config) as daemon, ExitStack() as stack:
        held = [connect(daemon, stack, PARTIAL) for _ in range(cap)]
        # The server sees every held connection before the next one comes.
        wait_until(lambda: len(daemon.server._server.server_state.connections) == cap)  # type: ignore[union-attr]
        extra = connect(daemon, stack)
        answer = closed_by_server(extra, within=10)
        assert answer is not None, "a connection beyond the cap was kept open"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 503 ")
        assert answer == b"" or f"limit of {cap} connections".encode() in answer
        held[0].close()
        with api(daemon) as client:
            health = wait_until(
                lambda: _get_or_none(client, "/healthz"), what="a request once a slot freed"
            )
            assert health.status_code == 200
            assert client.get("/jobs").status_code == 200  # authenticated, answered


def _get_or_none(client, path: str):  # type: ignore[no-untyped-def]
    import httpx

    try:
        return client.get(path)
    except httpx.TransportError:
        return None


def test_the_connection_cap_leaves_descriptors_under_the_open_file_limit() -> None:
    assert connection_cap(1024, None) == 1024
    assert connection_cap(1024, 65536) == 1024
    assert connection_cap(1024, 256) == 256 - RESERVED_FDS
    assert connection_cap(1024, 64) == MIN_CONNECTIONS


def test_connection_limits_are_config_keys_with_bounds(tmp_path: Path) -> None:
    defaults = DaemonConfig().api.limits()
    assert defaults.header_timeout_s == 10 and defaults.idle_timeout_s == 5
    assert defaults.max_connections == 1024
    config = make_config(tmp_path, api={"header_timeout_s": 2, "max_connections": 50})
    assert config.api.limits().header_timeout_s == 2
    assert config.api.limits().max_connections == 50
    for bad in ({"header_timeout_s": 0}, {"max_connections": 1}, {"idle_timeout_s": 1e300}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_config(tmp_path, api=bad)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_lets_a_burst_through_per_window_and_counts_the_rest() -> None:
    clock = Clock()
    throttle = ThrottledLog(every_s=10, burst=3, clock=clock)
    assert [throttle.allow() for _ in range(5)] == [
        (True, 0),
        (True, 0),
        (True, 0),
        (False, 0),
        (False, 0),
    ]
    clock.now += 9.9
    assert throttle.allow() == (False, 0)
    clock.now += 0.1  # a new window: the next record says how many were left out
    assert throttle.allow() == (True, 3)
    assert throttle.allow() == (True, 0)


def test_accept_errors_are_logged_a_bounded_number_of_times_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    handler = AcceptErrorHandler(ThrottledLog(every_s=10, burst=3, clock=clock))
    loop = asyncio.new_event_loop()
    try:
        emfile = OSError(errno.EMFILE, "Too many open files")
        context = {"message": "socket.accept() out of system resource", "exception": emfile}
        with caplog.at_level(logging.WARNING, logger="gpuopt.api"):
            for _ in range(20):  # asyncio retries accepting every second
                clock.now += 1
                for _n in range(1000):
                    handler(loop, dict(context))
        records = [r for r in caplog.records if r.name == "gpuopt.api"]
        assert 1 <= len(records) <= 3 * 2  # two windows of 10 s, three lines each at most
        assert all(r.exc_info is None for r in records)  # one line each, no traceback
        assert all("Too many open files" in r.getMessage() for r in records)
        assert any("more like it not logged" in r.getMessage() for r in records)
        # Anything else still reaches the loop's default handler (and its traceback).
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            handler(loop, {"message": "boom", "exception": ValueError("other")})
        assert any("boom" in r.getMessage() for r in caplog.records)
    finally:
        loop.close()


def test_tokens_still_guard_the_api_behind_the_limits(short_headers: Daemon) -> None:
    assert api(short_headers, token=None).get("/jobs").status_code == 401
    assert api(short_headers, token=TOKEN).get("/jobs").status_code == 200


def test_the_daemon_raises_its_soft_open_file_limit_within_the_hard_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    from optimizer.daemon.connections import raise_open_file_limit

    limits = {"now": (256, 4096)}
    monkeypatch.setattr(resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: limits.update(now=value))
    assert raise_open_file_limit(65536) == (256, 4096)
    assert limits["now"] == (4096, 4096)  # the hard limit is never raised
    limits["now"] = (1024, resource.RLIM_INFINITY)
    assert raise_open_file_limit(65536) == (1024, 65536)
    limits["now"] = (100_000, 200_000)
    assert raise_open_file_limit(65536) == (100_000, 100_000)  # never lowered
