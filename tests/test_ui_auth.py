"""The console's sign-in: the session cookie, what needs it, logout and CSRF, against a real
daemon serving the console on loopback (httpx; the browser test drives the same pages)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from optimizer.api import throttle
from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.ui import console_app
from optimizer.ui import session as sessions
from tests.helpers import TOKEN, make_config, make_offer, running, write_policy
from tests.helpers.offers import FakeSource
from tests.helpers.policies import policy_text

pytestmark = pytest.mark.usefixtures("daemon_env")

NOW = datetime(2026, 3, 14, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def daemon(tmp_path: Path, clock: ManualClock) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "small.yaml", policy_text("small", cap=1.0))
    source = FakeSource(
        [make_offer(observed_at=NOW), make_offer(usd_per_hour=3.0, zone="use1-az2")]
    )
    config = make_config(tmp_path, policy_dir=tmp_path / "policies")
    with running(config, face=console_app, clock=clock, sources={"aws": source}) as d:
        for poll in d.polls:
            poll.run_once()
        yield d


def browser(daemon: Daemon, **kwargs: object) -> httpx.Client:
    """A client with no bearer token that keeps cookies and does not follow redirects."""
    return httpx.Client(base_url=daemon.url, timeout=10, **kwargs)  # type: ignore[arg-type]


def sign_in(client: httpx.Client, token: str = TOKEN, **headers: str) -> httpx.Response:
    return client.post("/ui/login", data={"token": token, "next": "/ui/jobs"}, headers=headers)


def test_a_page_without_the_cookie_redirects_to_the_login_page(daemon: Daemon) -> None:
    with browser(daemon) as client:
        answer = client.get("/ui/")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/ui/login?next=/ui/"
        login = client.get("/ui/login?next=/ui/")
        assert login.status_code == 200
        assert 'name="token"' in login.text and 'type="password"' in login.text


def test_data_endpoints_and_actions_answer_401_or_redirect_without_the_cookie(
    daemon: Daemon,
) -> None:
    with browser(daemon) as client:
        assert client.get("/ui/fragments/overview").status_code == 401
        # the bearer token is the API's credential, not the console's
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/ui/fragments/overview", headers=bearer).status_code == 401
        assert client.get("/ui/", headers=bearer).status_code == 303
        assert client.post("/ui/logout", data={"csrf": "x"}).status_code == 303
        # the API itself still wants its token
        assert client.get("/jobs").status_code == 401


def test_a_wrong_token_shows_an_error_and_sets_no_cookie(daemon: Daemon) -> None:
    with browser(daemon) as client:
        answer = sign_in(client, token="not-the-token")
        assert answer.status_code == 401
        assert "That is not the API token of this daemon." in answer.text
        assert "set-cookie" not in answer.headers
        assert client.get("/ui/").status_code == 303


def test_the_right_token_sets_a_signed_httponly_strict_cookie_without_the_token(
    daemon: Daemon,
) -> None:
    with browser(daemon) as client:
        answer = sign_in(client)
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/jobs"
        cookie = answer.headers["set-cookie"]
        attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
        assert {"httponly", "samesite", "path", "max-age"} <= attributes
        assert "samesite=strict" in cookie.lower() and "path=/ui" in cookie.lower()
        assert "secure" not in attributes  # plain HTTP
        value = client.cookies[sessions.COOKIE]
        assert TOKEN not in value and TOKEN not in httpx.QueryParams(value).__str__()
        page = client.get("/ui/")
        assert page.status_code == 200 and "<h1>Overview</h1>" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert client.get("/ui/fragments/overview").status_code == 200


def test_the_cookie_is_secure_when_the_request_came_over_tls(daemon: Daemon) -> None:
    # uvicorn trusts X-Forwarded-Proto from loopback (a TLS-terminating proxy on the host)
    with browser(daemon) as client:
        answer = sign_in(client, **{"X-Forwarded-Proto": "https"})
        assert answer.status_code == 303
        assert "secure" in answer.headers["set-cookie"].lower().split("; ")


def test_a_tampered_or_expired_cookie_is_refused(daemon: Daemon, clock: ManualClock) -> None:
    with browser(daemon) as client:
        sign_in(client)
        value = client.cookies[sessions.COOKIE]
        body, mac = value.split(".")
        client.cookies.set(sessions.COOKIE, f"{body}.{mac[::-1]}", path="/ui")
        assert client.get("/ui/").status_code == 303
        client.cookies.set(sessions.COOKIE, value, path="/ui")
        assert client.get("/ui/").status_code == 200
        clock.advance(sessions.LIFETIME_S + 1)
        assert client.get("/ui/").status_code == 303


def test_logout_needs_the_csrf_token_and_clears_the_cookie(daemon: Daemon) -> None:
    with browser(daemon) as client:
        sign_in(client)
        assert client.post("/ui/logout", data={"csrf": "forged"}).status_code == 403
        assert client.get("/ui/").status_code == 200
        csrf = sessions.csrf_token(TOKEN, _session(client))
        answer = client.post("/ui/logout", data={"csrf": csrf})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
        assert "max-age=0" in answer.headers["set-cookie"].lower()
        assert client.get("/ui/").status_code == 303


def test_login_sends_only_console_paths_onwards(daemon: Daemon) -> None:
    with browser(daemon) as client:
        for target in ("https://evil.example/", "//evil.example/ui/", "/jobs"):
            answer = client.post("/ui/login", data={"token": TOKEN, "next": target})
            assert answer.headers["location"] == "/ui/", target


def test_static_assets_are_served_from_the_package(daemon: Daemon) -> None:
    with browser(daemon) as client:
        script = client.get("/ui/static/uPlot.iife.min.js")
        assert script.status_code == 200 and script.text.startswith(
            "/*! https://github.com/leeoniya/uPlot"
        )
        assert script.headers["content-type"].startswith("text/javascript")
        assert client.get("/ui/static/console.css").status_code == 200
        assert client.get("/ui/static/..%2Fsession.py").status_code == 404
        assert client.get("/ui/static/VENDORED.md").status_code == 404


def test_a_non_ascii_cookie_or_csrf_field_is_only_not_signed_in(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    # Sent as raw bytes: the server sees them as Latin-1 text, none of it ASCII.
    for value in ("\u00e9t\u00e9.\u00e9", "a.\u00ff" * 3, "\u00e9"):
        cookie = f"{sessions.COOKIE}={value}".encode()
        with browser(daemon) as client:
            assert client.get("/ui/", headers={"Cookie": cookie}).status_code == 303
            answer = client.get("/ui/fragments/overview", headers={"Cookie": cookie})
            assert answer.status_code == 401
            assert client.get("/ui/login", headers={"Cookie": cookie}).status_code == 200
    with browser(daemon) as client:
        sign_in(client)
        for csrf in ("\u00e9", "\u4e2d\u6587", "\x00"):
            assert client.post("/ui/logout", data={"csrf": csrf}).status_code == 403
        assert client.get("/ui/").status_code == 200  # still signed in
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


def test_wrong_tokens_are_throttled_per_address_the_right_one_too_until_it_refills(
    daemon: Daemon, clock: ManualClock
) -> None:
    with browser(daemon) as client:
        # an empty field is an attempt too
        for guess in ["", *["guess"] * (throttle.BURST - 1)]:
            assert sign_in(client, token=guess).status_code == 401
        refused = sign_in(client, token="guess")
        assert refused.status_code == 429
        wait = int(refused.headers["retry-after"])
        assert 0 < wait <= throttle.REFILL_S
        assert "Too many wrong tokens from your address" in refused.text
        # Throttled, the right token is not even checked: no guess can be told right.
        right = sign_in(client)
        assert right.status_code == 429 and "set-cookie" not in right.headers
        # The API's bearer token shares the count: it checks the same secret.
        bearer = client.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 429 and bearer.headers["retry-after"] == str(wait)
        # Another address (a proxy uvicorn trusts says so) is not throttled.
        other = sign_in(client, **{"X-Forwarded-For": "203.0.113.9"})
        assert other.status_code == 303
        client.cookies.clear()
        clock.advance(wait)
        assert sign_in(client).status_code == 303  # one failure's worth refilled


def _session(client: httpx.Client) -> sessions.Session:
    found = sessions.verify(TOKEN, client.cookies[sessions.COOKIE], NOW)
    assert found is not None
    return found


def test_sessions_are_signed_with_the_token_and_expire() -> None:
    value, session = sessions.issue(TOKEN, NOW, lifetime_s=60)
    assert sessions.verify(TOKEN, value, NOW) == session
    assert sessions.verify("another-token", value, NOW) is None
    assert sessions.verify(TOKEN, value, datetime(2026, 3, 14, 12, 1, tzinfo=UTC)) is None
    assert sessions.verify(TOKEN, "garbage", NOW) is None
    assert sessions.verify(TOKEN, None, NOW) is None
    assert sessions.csrf_ok(TOKEN, session, sessions.csrf_token(TOKEN, session))
    assert not sessions.csrf_ok(TOKEN, session, None)
    assert sessions.verify(TOKEN, "\u00e9t\u00e9.\u00e9", NOW) is None
    assert not sessions.csrf_ok(TOKEN, session, "\u00e9")


def test_the_vendored_files_are_the_ones_recorded() -> None:
    import hashlib
    import re

    static = Path(__file__).resolve().parents[1] / "optimizer" / "ui" / "static"
    recorded = re.findall(
        r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", (static / "VENDORED.md").read_text(), re.M
    )
    assert {name for name, _ in recorded} == {"uPlot.iife.min.js", "uPlot.min.css"}
    for name, digest in recorded:
        assert hashlib.sha256((static / name).read_bytes()).hexdigest() == digest, name
