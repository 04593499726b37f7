"""The monthly cost summary alert: raised by the leader on a month's first reconcile pass,
once per month across passes, restarts and replicas, delivered to Slack and a webhook; and on
demand through `POST /costs/notify`. Time is a ManualClock crossing a month boundary; the
figures are computed by hand beside them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from optimizer.alerts.channel import Alert
from optimizer.alerts.outbox import Emitter
from optimizer.alerts.routing import Router
from optimizer.alerts.slack import slack_message
from optimizer.alerts.webhook import verify_signature
from optimizer.clock import ManualClock
from optimizer.costs.summary import message, period_names, previous_month, summarize
from optimizer.daemon.service import Daemon
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.ledger import Ledger
from optimizer.jobs.summary import MonthlySummary
from optimizer.model import EventKind, Market
from optimizer.store import Store
from tests.helpers import api, make_config, make_offer, running, wait_until
from tests.helpers.jobs import SECRET

pytestmark = pytest.mark.usefixtures("daemon_env")

MARCH = datetime(2026, 3, 1, tzinfo=UTC)
APRIL = datetime(2026, 4, 1, tzinfo=UTC)
KIND = EventKind.COSTS_MONTHLY_SUMMARY


def t(day: int, hour: float = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, tzinfo=UTC) + timedelta(hours=hour)


def attempt(
    store: Store,
    job: str,
    launched: datetime,
    terminated: datetime,
    *,
    running: bool = True,
    **pool: Any,
) -> None:
    """An ended attempt of a finished job on AWS g5.xlarge in use1-az1 (spot at $0.40/h
    unless `pool` says otherwise); its job ran throughout when `running`."""
    job_id = store.jobs.add_job(job, "team", {"run": "x"}, at=launched)
    store.jobs.transition_job(job_id, expected="pending", state="succeeded", reason="", at=launched)
    key = f"{job}-1"
    store.jobs.create_attempt(
        job_id, 1, key, make_offer(observed_at=launched, **pool), "s", launched
    )
    store.jobs.update_attempt(
        key,
        instance_id=f"i-{key}",
        launched_at=launched,
        job_started_at=launched if running else None,
        ended_at=terminated,
        state="ended",
        instance_gone=True,
        terminated_at=terminated,
        terminated_by="gpuopt",
    )


def march(store: Store) -> None:
    """March's attempts, against on-demand's $1.00/h:
    - big: spot, 10 h at $0.40/h = $4.00 (baseline $10.00), all of it running;
    - edge: on-demand at $1.00/h from March 31 22:00 to April 1 00:02: March's line is 2 h,
      $2.00 (baseline $2.00);
    - small: spot, 1 h at $0.40/h = $0.40 (baseline $1.00), its job never started: the whole
      hour is overhead ($0.40).
    """
    store.prices.record_offers(
        [make_offer(observed_at=MARCH, usd_per_hour=1.00, market=Market.ON_DEMAND)]
    )
    attempt(store, "big", t(10), t(10, 10))
    attempt(
        store, "edge", t(31, 22), t(1, 2 / 60, month=4), market=Market.ON_DEMAND, usd_per_hour=1.0
    )
    attempt(store, "small", t(20), t(20, 1), running=False)


SPEND = 4.00 + 2.00 + 0.40
BASELINE = 10.00 + 2.00 + 1.00
OVERHEAD = 0.40


def check_march(data: dict[str, Any], trigger: str) -> None:
    assert (data["month"], data["period"], data["trigger"]) == ("2026-03", "March 2026", trigger)
    assert (data["period_start"], data["period_end"]) == (
        "2026-03-01T00:00:00Z",
        "2026-04-01T00:00:00Z",
    )
    assert data["spend_usd"] == pytest.approx(SPEND)
    assert data["total_usd"] == pytest.approx(SPEND)  # no root volumes
    assert data["on_demand_usd"] == pytest.approx(BASELINE)
    assert data["savings_usd"] == pytest.approx(BASELINE - SPEND)
    assert data["savings_fraction"] == pytest.approx((BASELINE - SPEND) / BASELINE)
    assert data["net_savings_usd"] == pytest.approx(BASELINE - SPEND - OVERHEAD)
    assert data["net_savings_fraction"] == pytest.approx((BASELINE - SPEND - OVERHEAD) / BASELINE)
    assert data["overhead_usd"] == pytest.approx(OVERHEAD)
    assert [(j["job"], round(j["total_usd"], 6)) for j in data["top_jobs"]] == [
        ("big", 4.0),
        ("edge", 2.0),
        ("small", 0.4),
    ]
    assert (data["jobs"], data["attempts"]) == (3, 3)


# -- the pure part ---------------------------------------------------------------------------


def test_previous_month_and_period_names() -> None:
    assert previous_month(t(1, 0.01, month=1)) == (datetime(2025, 12, 1, tzinfo=UTC), t(1, month=1))
    assert previous_month(t(31, 23.9)) == (t(1, month=2), MARCH)
    assert period_names(MARCH, APRIL) == ("2026-03", "March 2026")
    assert period_names(t(1, month=1), APRIL) == ("2026-01/2026-03", "January 2026 to March 2026")
    assert period_names(t(14), APRIL)[0] == "2026-03-14T00:00:00Z/2026-04-01T00:00:00Z"


def test_message_and_slack_layout_say_the_figures(store: Store) -> None:
    march(store)
    lines = Ledger(store).lines(since=MARCH, until=APRIL, now=t(2, month=4))
    data = summarize(lines, MARCH, APRIL)
    check_march(data, "schedule")
    text = message(data)
    assert text == (
        "March 2026: $6.40 spent (instances $6.40, root volumes $0.00) on 3 attempt(s) of "
        "3 job(s); $6.60 saved against $13.00 on-demand: 51% gross, 48% net of $0.40 "
        "overhead. Top jobs by spend: big $4.00, edge $2.00, small $0.40"
    )
    alert = Alert("k#ops", 7, KIND.value, "info", text, t(1, month=4), data=data)
    body = slack_message(alert)
    assert body["blocks"][0]["text"]["text"] == "Monthly cost summary"
    section = body["blocks"][1]
    assert section["text"]["text"] == "*March 2026*: $6.40 spent on 3 attempt(s) of 3 job(s)"
    fields = [f["text"] for f in section["fields"]]
    assert fields[1] == "*Spend*\n$6.40: instances $6.40, root volumes $0.00"
    assert fields[2].startswith("*Saved against on-demand*\n$6.60 saved against $13.00")
    assert fields[3] == "*Top jobs by spend*\n`big` $4.00\n`edge` $2.00\n`small` $0.40"
    assert len(fields) == 5 and body["text"].startswith("Monthly cost summary: March 2026:")


# -- scheduled: once per month ---------------------------------------------------------------


def context(store: Store, now: datetime) -> ReconcileContext:
    emitter = Emitter(store.events, Router([], ["ops"]))
    return ReconcileContext(
        now=now, jobs=(), policies={}, store=store, providers={}, emitter=emitter, clock=lambda: now
    )


def summaries(store: Store) -> list[Any]:
    return store.events.of_kind(KIND, MARCH)


def test_a_replica_or_a_restart_finds_the_month_raised_and_a_late_leader_catches_up(
    store: Store,
) -> None:
    march(store)
    first = MonthlySummary()
    first(context(store, t(31, 23.99)))  # still March: February had nothing, nothing raised
    assert summaries(store) == []
    first(context(store, t(3, 5, month=4)))  # no leader on the 1st: caught up on the 3rd
    second = MonthlySummary()  # another replica after a failover, or a restart
    second(context(store, t(3, 6, month=4)))
    (event,) = summaries(store)
    check_march(event.data, "schedule")
    (alert,) = store.events.list_alerts()
    assert alert["dedupe_key"] == "costs-summary:2026-03#ops"
    # a month whose first week passed with no leader is not raised late
    late = MonthlySummary()
    late(context(store, t(8, 0, month=5)))
    assert len(summaries(store)) == 1


# -- end to end: a daemon on a manual clock --------------------------------------------------


@pytest.fixture
def receiver(httpserver: HTTPServer) -> Iterator[HTTPServer]:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    httpserver.expect_request("/slack", method="POST").respond_with_data("ok")
    yield httpserver


def posts(server: HTTPServer, path: str) -> list[dict[str, Any]]:
    """What `path` received; the webhook's posts with their signatures checked."""
    out = []
    for request, _ in server.log:
        if request.path != path:
            continue
        body = request.get_data()
        if path == "/hook":
            stamp = request.headers["X-Gpuopt-Timestamp"]
            signature = request.headers["X-Gpuopt-Signature"]
            assert verify_signature(SECRET, stamp, body, signature, now=float(stamp))
        out.append(json.loads(body))
    return out


def test_the_leader_raises_last_months_summary_once_when_the_month_turns(
    tmp_path: Path, receiver: HTTPServer
) -> None:
    clock = ManualClock(t(31, 23.95))
    config = make_config(
        tmp_path,
        alerts={
            "channels": {
                "ops": {"type": "slack", "url": receiver.url_for("/slack")},
                "hook": {"type": "webhook", "url": receiver.url_for("/hook"), "secret": SECRET},
            }
        },
    )

    def passes(daemon: Daemon, n: int) -> None:
        """Ask for reconcile passes until `n` have run."""
        while (done := daemon.reconcile.passes) < n:
            daemon.reconcile.wakeup.set()
            wait_until(lambda: daemon.reconcile.passes > done, what="a reconcile pass")

    with running(config, clock=clock) as daemon:
        march(daemon.store)
        passes(daemon, 2)
        assert summaries(daemon.store) == []  # March 31, 23:57: not yet
        clock.set(t(1, 0.05, month=4))  # the month turns
        passes(daemon, 3)
        passes(daemon, 4)
        (event,) = summaries(daemon.store)
        check_march(event.data, "schedule")
        assert event.at == t(1, 0.05, month=4)
        delivered = wait_until(
            lambda: [a for a in posts(receiver, "/hook") if a["kind"] == KIND.value] or None,
            what="the summary's webhook alert",
        )
        slack = wait_until(lambda: posts(receiver, "/slack") or None, what="the Slack post")
    (alert,) = delivered
    assert alert["title"] == "Monthly cost summary" and alert["data"]["month"] == "2026-03"
    assert alert["id"] == "costs-summary:2026-03#hook"
    (post,) = [p for p in slack if p["blocks"][0]["text"]["text"] == "Monthly cost summary"]
    assert "`big` $4.00" in json.dumps(post)
    clock.advance(hours=2)
    with running(config, clock=clock) as daemon:  # a restart the same day
        passes(daemon, 2)
        assert len(summaries(daemon.store)) == 1
        rows = [a for a in daemon.store.events.list_alerts() if a["event_id"] == event.id]
    assert sorted(a["channel"] for a in rows) == ["hook", "ops"]


def test_notify_raises_the_summary_on_demand(tmp_path: Path) -> None:
    clock = ManualClock(t(15, 12, month=4))
    with running(make_config(tmp_path), clock=clock) as daemon, api(daemon) as client:
        march(daemon.store)
        answer = client.post("/costs/notify").json()  # last month by default
        again = client.post("/costs/notify", params={"since": "2026-03-14"}).json()
        bad = client.post("/costs/notify", params={"until": "2026-03"})
    check_march(answer["data"], "request")
    check_march(again["data"], "request")  # lines are by month: all of March
    assert answer["channels"] == [] and answer["message"].startswith("March 2026: $6.40 spent")
    assert answer["event_id"] != again["event_id"]  # on demand: every time it is asked
    assert bad.status_code == 422 and "since" in bad.json()["detail"]
