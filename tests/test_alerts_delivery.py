"""Alert delivery against a real local HTTP receiver (pytest-httpserver): retries with
back-off on an injected clock, exactly-once delivery, signatures a receiver can verify,
the Slack Block Kit shape, and an outbox that survives a restart."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import re
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from optimizer.alerts import (
    Emitter,
    RetryConfig,
    Router,
    SlackNotifier,
    WebhookNotifier,
    verify_signature,
)
from optimizer.alerts.channel import post
from optimizer.clock import ManualClock
from optimizer.daemon.logsetup import configure
from optimizer.daemon.loops.deliver import DeliverLoop
from optimizer.daemon.loops.watch import PolicyWatcher
from optimizer.daemon.metrics import Metrics
from optimizer.daemon.policies import PolicyRegistry
from optimizer.store import Store
from tests.helpers import T0, make_config, running, wait_until, write_policy

pytestmark = pytest.mark.usefixtures("daemon_env")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


SECRET = "receiver-shared-secret-42!"


class Receiver:
    """A webhook receiver that verifies signatures as a real one would."""

    def __init__(self, clock: ManualClock, statuses: list[int]) -> None:
        self.clock = clock
        self.statuses = statuses  # answers in order; the last one repeats
        self.requests: list[dict] = []

    def __call__(self, request: Request) -> Response:
        body = request.get_data()
        valid = verify_signature(
            SECRET,
            request.headers.get("X-Gpuopt-Timestamp"),
            body,
            request.headers.get("X-Gpuopt-Signature"),
            now=self.clock().timestamp(),
        )
        status = self.statuses[min(len(self.requests), len(self.statuses) - 1)]
        self.requests.append(
            {
                "valid": valid,
                "delivery": request.headers.get("X-Gpuopt-Delivery"),
                "event": request.headers.get("X-Gpuopt-Event"),
                "body": json.loads(body),
                "status": status,
            }
        )
        if not valid:
            return Response("bad signature", status=401)
        return Response("busy" if status >= 300 else "ok", status=status)

    @property
    def delivered(self) -> list[dict]:
        return [r for r in self.requests if r["valid"] and r["status"] < 300]


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock):
    with Store(f"sqlite:///{tmp_path / 'alerts.db'}", clock=clock) as db:
        db.create_all()
        yield db


def webhook_loop(store: Store, url: str, clock: ManualClock, **retry: float) -> DeliverLoop:
    client = httpx.Client(timeout=5)
    notifier = WebhookNotifier("hook", SecretStr(url), SecretStr(SECRET), client, clock=clock)
    return DeliverLoop(
        store,
        {"hook": notifier},
        clock,
        retry=RetryConfig(**retry),
        rng=random.Random(7),
        api_url="http://127.0.0.1:8470",
    )


def emit_price_drop(store: Store, channels: tuple[str, ...] = ("hook",)) -> int:
    emitter = Emitter(store.events, Router([], channels))
    return emitter.emit(
        "price.dropped",
        "policy small: best offer is 25% cheaper",
        policy="small",
        data={"price_before": 0.8, "price_after": 0.6},
        dedupe_key="drop:small:1",
    )


def test_a_receiver_that_is_down_gets_the_alert_once_it_is_back(
    store: Store, clock: ManualClock, httpserver: HTTPServer
) -> None:
    receiver = Receiver(clock, [503, 503, 200])
    httpserver.expect_request("/hook", method="POST").respond_with_handler(receiver)
    loop = webhook_loop(store, httpserver.url_for("/hook"), clock, base_s=10, max_s=600)
    emit_price_drop(store, ("hook", "ops"))

    waits = []
    for attempt in (1, 2):
        report = loop.run_once()
        assert report.retried == 1 and len(receiver.requests) == attempt
        [row] = [a for a in store.events.list_alerts(state="pending") if a["channel"] == "hook"]
        assert row["attempts"] == attempt and "HTTP 503" in row["last_error"]
        waits.append(row["next_attempt_at"] - clock())
        assert loop.run_once().retried == 0  # not due yet: nothing is sent
        assert len(receiver.requests) == attempt
        clock.advance(waits[-1].total_seconds())

    assert loop.run_once().delivered == 1
    for _ in range(3):  # delivered means done: later passes send nothing
        clock.advance(3600)
        loop.run_once()
    assert len(receiver.requests) == 3 and len(receiver.delivered) == 1
    assert all(r["valid"] for r in receiver.requests)
    # the delivery id is the alert id's SHA-256, the same on every retry
    assert {r["delivery"] for r in receiver.requests} == {
        hashlib.sha256(b"drop:small:1#hook").hexdigest()
    }
    assert {r["body"]["id"] for r in receiver.requests} == {"drop:small:1#hook"}
    # Exponential back-off with jitter in [0.5, 1]: 10 s, then 20 s, scaled.
    assert timedelta(seconds=5) <= waits[0] <= timedelta(seconds=10)
    assert timedelta(seconds=10) <= waits[1] <= timedelta(seconds=20)
    # The event was routed to "ops" too, a channel this loop does not have: failed, said why.
    assert store.events.alert_counts() == {"pending": 0, "delivered": 1, "failed": 1}
    [orphan] = store.events.list_alerts(state="failed")
    assert orphan["channel"] == "ops" and "not configured" in orphan["last_error"]
    body = receiver.delivered[0]["body"]
    assert body["kind"] == "price.dropped" and body["price_before"] == 0.8
    assert body["link"].startswith("http://127.0.0.1:8470/events/")


def test_the_receiver_rejects_a_tampered_body_and_a_replayed_request(clock: ManualClock) -> None:
    from optimizer.alerts.webhook import sign

    body = b'{"kind":"price.dropped"}'
    stamp = int(clock().timestamp())
    signature = sign(SECRET, stamp, body)
    now = clock().timestamp()
    assert verify_signature(SECRET, str(stamp), body, signature, now=now)
    assert not verify_signature(SECRET, str(stamp), body + b" ", signature, now=now)
    assert not verify_signature("another-secret-entirely", str(stamp), body, signature, now=now)
    assert not verify_signature(SECRET, str(stamp), body, signature, now=now + 301)  # replay
    assert not verify_signature(SECRET, str(stamp), body, signature, now=now - 301)  # future
    assert not verify_signature(SECRET, None, body, signature, now=now)
    assert not verify_signature(SECRET, "soon", body, signature, now=now)


def test_a_permanent_refusal_fails_the_alert_without_retrying(
    store: Store, clock: ManualClock, httpserver: HTTPServer
) -> None:
    httpserver.expect_request("/hook").respond_with_data("no such hook", status=404)
    loop = webhook_loop(store, httpserver.url_for("/hook"), clock)
    emit_price_drop(store)
    assert loop.run_once().failed == 1
    [row] = store.events.list_alerts(state="failed")
    assert row["attempts"] == 1 and row["last_error"].startswith("HTTP 404: no such hook")


def test_an_alert_fails_after_its_last_attempt_and_honours_retry_after(
    store: Store, clock: ManualClock, httpserver: HTTPServer
) -> None:
    httpserver.expect_request("/hook").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "120"}
    )
    loop = webhook_loop(store, httpserver.url_for("/hook"), clock, max_attempts=2, base_s=1)
    emit_price_drop(store)
    assert loop.run_once().retried == 1
    [row] = store.events.list_alerts(state="pending")
    assert row["next_attempt_at"] - clock() == timedelta(seconds=120)
    clock.advance(120)
    assert loop.run_once().failed == 1
    [row] = store.events.list_alerts(state="failed")
    assert "gave up after 2 attempt(s)" in row["last_error"]


def test_a_slack_alert_is_block_kit_with_what_who_prices_and_a_link(
    store: Store, clock: ManualClock, httpserver: HTTPServer
) -> None:
    received: list[dict] = []

    def slack(request: Request) -> Response:
        assert request.headers["Content-Type"].startswith("application/json")
        received.append(json.loads(request.get_data()))
        return Response("ok")

    httpserver.expect_request("/services/T1/B2/xyz", method="POST").respond_with_handler(slack)
    url = SecretStr(httpserver.url_for("/services/T1/B2/xyz"))
    notifier = SlackNotifier("ops", url, httpx.Client(timeout=5), clock=clock)
    loop = DeliverLoop(store, {"ops": notifier}, clock, api_url="http://gpuopt.example:8470/")
    event_id = emit_price_drop(store, ("ops",))
    assert loop.run_once().delivered == 1

    [message] = received
    assert message["text"].startswith("Best offer got cheaper: policy small")
    header, section, context = message["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": "Best offer got cheaper"},
    }
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    fields = [f["text"] for f in section["fields"]]
    assert [f.split("\n")[0] for f in fields] == [
        "*What*",
        "*Job / policy*",
        "*Price before → after*",
        "*Severity*",
    ]
    assert fields[1] == "*Job / policy*\npolicy `small`"
    assert fields[2] == "*Price before → after*\n$0.8000/h → $0.6000/h (-25.0%)"
    assert fields[3].endswith("info")
    assert context["type"] == "context"
    link = context["elements"][0]["text"]
    assert link == f"<http://gpuopt.example:8470/events/{event_id}|Open in the gpuopt API>"


def test_an_unreachable_channel_is_skipped_for_the_rest_of_the_pass(
    store: Store, clock: ManualClock
) -> None:
    loop = webhook_loop(store, "http://127.0.0.1:9/hook", clock)  # port 9 refuses
    for n in range(3):
        Emitter(store.events, Router([], ["hook"])).emit("price.dropped", f"drop {n}")
    report = loop.run_once()
    assert (report.retried, report.skipped) == (1, 2)
    assert [a["attempts"] for a in store.events.list_alerts()] == [0, 0, 1]


def test_a_restarted_daemon_delivers_what_the_last_one_left_pending(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    clock = ManualClock(T0)
    receiver = Receiver(clock, [503, 200])
    httpserver.expect_request("/hook", method="POST").respond_with_handler(receiver)
    config = make_config(
        tmp_path,
        alerts={
            "channels": {
                "hook": {"type": "webhook", "url": httpserver.url_for("/hook"), "secret": SECRET}
            }
        },
    )
    with running(config, clock=clock) as first:
        first.emitter.emit("price.dropped", "cheaper", policy="small", dedupe_key="drop:x")
        wait_until(lambda: receiver.requests, what="the first (failed) attempt")
        wait_until(lambda: first.store.events.list_alerts()[0]["attempts"] == 1, what="the booking")

    clock.advance(3600)  # past any back-off
    with running(config, clock=clock) as second:
        wait_until(
            lambda: second.store.events.alert_counts()["delivered"] == 1,
            what="the restarted daemon's delivery",
        )
        # The same alert, not a new one: one row, two attempts, one delivery.
        [row] = second.store.events.list_alerts()
        assert row["attempts"] == 2 and row["dedupe_key"] == "drop:x#hook"
    assert len(receiver.requests) == 2 and len(receiver.delivered) == 1


def test_a_failing_alert_holds_back_later_ones_to_its_channel_only(
    store: Store, clock: ManualClock, httpserver: HTTPServer
) -> None:
    # docs/alerts.md: each receiver gets alerts oldest first, retries included.
    hook = Receiver(clock, [503, 200])
    other = Receiver(clock, [200])
    httpserver.expect_request("/hook", method="POST").respond_with_handler(hook)
    httpserver.expect_request("/other", method="POST").respond_with_handler(other)
    loop = webhook_loop(store, httpserver.url_for("/hook"), clock, base_s=10, max_s=600)
    client = httpx.Client(timeout=5)
    loop.notifiers["other"] = WebhookNotifier(
        "other", SecretStr(httpserver.url_for("/other")), SecretStr(SECRET), client, clock=clock
    )
    metrics = Metrics()
    metrics.watch(store)
    emitter = Emitter(store.events, Router([], ["hook", "other"]))
    for n in range(3):
        emitter.emit("price.dropped", f"drop {n}")
        clock.advance(1)

    first = loop.run_once()  # drop 0 fails on hook: drops 1 and 2 wait behind it
    assert (first.delivered, first.retried, first.skipped) == (3, 1, 2)
    assert [r["body"]["message"] for r in other.delivered] == ["drop 0", "drop 1", "drop 2"]
    assert [r["body"]["message"] for r in hook.requests] == ["drop 0"]
    assert metrics.sample("gpuopt_alert_backlog", {"channel": "hook"}) == 3
    assert metrics.sample("gpuopt_alert_backlog", {"channel": "other"}) is None
    oldest = metrics.sample("gpuopt_alert_backlog_oldest_timestamp_seconds", {"channel": "hook"})
    assert oldest == T0.timestamp()

    # Drops 1 and 2 were never tried, so they count as due; still the channel waits.
    clock.advance(1)
    assert loop.run_once().delivered == 0 and len(hook.requests) == 1

    [row] = [a for a in store.events.list_alerts(state="pending") if a["attempts"] == 1]
    clock.advance((row["next_attempt_at"] - clock()).total_seconds())
    assert loop.run_once().delivered == 3
    assert [r["body"]["message"] for r in hook.delivered] == ["drop 0", "drop 1", "drop 2"]
    assert metrics.sample("gpuopt_alert_backlog", {"channel": "hook"}) is None


FORGED = "2026-01-01 00:00:00,000 INFO optimizer.daemon.loops.deliver: all alerts delivered"
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_policy_file_named_with_a_newline_forges_no_log_line_and_blocks_no_channel(
    store: Store, clock: ManualClock, httpserver: HTTPServer, tmp_path: Path, fmt: str
) -> None:
    # The rejected file's alert carries its path in its id; the receiver is busy once, so
    # the deliver loop logs that id, then takes it on the retry.
    receiver = Receiver(clock, [503, 200])
    httpserver.expect_request("/hook", method="POST").respond_with_handler(receiver)
    policies = tmp_path / "policies"
    write_policy(policies, f"evil\n{FORGED}\r.yaml", "name: [unclosed")
    emitter = Emitter(store.events, Router([], ["hook"]))
    watcher = PolicyWatcher(policies, PolicyRegistry(), store, emitter, clock)
    loop = webhook_loop(store, httpserver.url_for("/hook"), clock, base_s=10, max_s=600)
    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure(fmt, "info", stream=out)
    try:
        assert watcher.run_once() == ["rejected"]  # the first pass reads what is there
        assert loop.run_once().retried == 1
        clock.advance(600)
        assert loop.run_once().delivered == 1
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)

    [alert] = [r["body"] for r in receiver.delivered]
    assert alert["kind"] == "policy.rejected" and "\n" in alert["id"]  # the body keeps it
    digest = hashlib.sha256(alert["id"].encode()).hexdigest()
    assert [r["delivery"] for r in receiver.requests] == [digest, digest]
    lines = out.getvalue().splitlines()
    failed = [line for line in lines if "failed" in line]
    assert len(failed) == 1 and "HTTP 503" in failed[0]
    for line in lines:  # every line is a record of its own, none the forged one
        if fmt == "json":
            assert set(json.loads(line)) >= {"ts", "level", "logger", "msg"}
        else:
            assert LOG_LINE.match(line), line
            assert not line.startswith(FORGED[:23])
    if fmt == "text":
        assert f"evil\\n{FORGED}\\r.yaml" in failed[0]
    else:
        assert f"evil\n{FORGED}\r.yaml" in json.loads(failed[0])["msg"]


def test_slacks_notification_text_is_escaped_as_its_blocks_are(
    store: Store, clock: ManualClock, httpserver: HTTPServer
) -> None:
    received: list[dict] = []

    def slack(request: Request) -> Response:
        received.append(json.loads(request.get_data()))
        return Response("ok")

    httpserver.expect_request("/services/T1/B2/xyz", method="POST").respond_with_handler(slack)
    url = SecretStr(httpserver.url_for("/services/T1/B2/xyz"))
    notifier = SlackNotifier("ops", url, httpx.Client(timeout=5), clock=clock)
    loop = DeliverLoop(store, {"ops": notifier}, clock)
    Emitter(store.events, Router([], ["ops"])).emit(
        "policy.rejected",
        "evil <!channel> & <https://phish.example|sign in>.yaml: edit rejected",
        severity="warning",
    )
    assert loop.run_once().delivered == 1

    [message] = received
    text = message["text"]
    assert "<" not in text and ">" not in text
    assert "&lt;!channel&gt; &amp; &lt;https://phish.example|sign in&gt;" in text
    section = message["blocks"][1]["text"]["text"]
    assert "&lt;!channel&gt; &amp; &lt;https://phish.example|sign in&gt;" in section


def test_a_request_the_client_refuses_to_send_fails_at_once_and_holds_back_nothing(
    clock: ManualClock, httpserver: HTTPServer
) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    with httpx.Client(timeout=5) as client:
        refused = post(
            client,
            httpserver.url_for("/hook"),
            b"{}",
            {"X-Bad": "line\nX-Forged: 1"},
            secrets=[],
            now=clock(),
        )
    assert not refused.ok and refused.permanent and not refused.unreachable
    assert refused.error.startswith("request refused before sending")
    assert httpserver.log == []  # nothing reached the receiver
