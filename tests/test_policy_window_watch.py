"""At a schedule window's boundary the daemon re-evaluates the policy's running jobs and
alerts what changed: once per boundary, whichever replica sees it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from optimizer.alerts.outbox import Emitter
from optimizer.alerts.routing import Router
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.windows import JobVerdict, WindowChange, WindowWatch
from optimizer.model import EventKind, Market
from optimizer.store import Store
from policies.loader import parse_policy
from policies.schema import Policy
from tests.helpers.offers import T0, make_offer

POLICY = parse_policy(
    """\
apiVersion: gpuopt/v1
kind: Policy
name: team
markets: [spot, on_demand]
schedule:
  timezone: Europe/Berlin
  windows:
    - name: office-hours
      days: [mon, tue, wed, thu, fri]
      hours: "09:00-18:00"
      markets: [on_demand]
""",
    path="team.yaml",
)
SPOT = make_offer()  # g5.xlarge spot in us-east-1, $0.40/h
ON_DEMAND = make_offer(market=Market.ON_DEMAND, zone=None, usd_per_hour=1.01)
# Friday 16 January 2026: office hours start at 09:00 CET (08:00 UTC), end at 18:00 (17:00).
OPENS = datetime(2026, 1, 16, 8, 0, tzinfo=UTC)
CLOSES = datetime(2026, 1, 16, 17, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Loaded:
    policy: Policy


def context(store: Store, now: datetime) -> ReconcileContext:
    return ReconcileContext(
        now=now,
        jobs=tuple(store.jobs.live_jobs()),
        policies={"team": Loaded(POLICY)},
        store=store,
        providers={},
        emitter=Emitter(store.events, Router([], ["ops"])),
        clock=lambda: now,
    )


def running_job(store: Store) -> None:
    store.prices.record_offers([SPOT, ON_DEMAND])
    job = store.jobs.add_job("train", "team", {"run": "x"}, at=T0)
    store.jobs.transition_job(job, expected="pending", state="running", reason="", at=T0)
    store.jobs.create_attempt(job, 1, "train-1", SPOT, "sha", T0)


def window_events(store: Store) -> list:
    return store.events.of_kind(EventKind.POLICY_WINDOW_CHANGED, T0)


def test_office_hours_opening_alerts_that_a_spot_job_is_no_longer_allowed(store: Store) -> None:
    running_job(store)
    seen: list[tuple[WindowChange, Sequence[JobVerdict]]] = []
    watch = WindowWatch(listeners=[lambda ctx, change, verdicts: seen.append((change, verdicts))])
    watch(context(store, OPENS - timedelta(minutes=5)))
    assert window_events(store) == [] and seen == []

    watch(context(store, OPENS + timedelta(seconds=30)))
    (event,) = window_events(store)
    assert event.severity == "warning" and event.policy == "team"
    assert event.message == (
        "policy team: (no window) -> office-hours at Fri 2026-01-16 09:00 CET: markets "
        "[spot, on_demand] -> [on_demand]. Running jobs re-evaluated: train on "
        "aws/us-east-1/use1-az1/g5.xlarge/spot: no longer allowed (market: spot not allowed "
        "(markets: on_demand))"
    )
    assert event.data["at"] == "2026-01-16T08:00:00Z" and event.data["after"] == "office-hours"
    assert event.data["jobs"][0]["allowed"] is False and event.data["jobs"][0]["rule"] == "market"
    ((change, verdicts),) = seen
    assert change.after.markets == ["on_demand"] and change.before.markets == ["spot", "on_demand"]
    assert [v.allowed for v in verdicts] == [False]

    # the same pass again, and another replica starting a minute later: still one event
    watch(context(store, OPENS + timedelta(seconds=40)))
    WindowWatch()(context(store, OPENS + timedelta(minutes=1)))
    assert len(window_events(store)) == 1 and len(seen) == 1


def test_office_hours_closing_says_the_job_is_allowed_again(store: Store) -> None:
    running_job(store)
    watch = WindowWatch()
    watch(context(store, CLOSES - timedelta(minutes=1)))
    watch(context(store, CLOSES + timedelta(minutes=1)))
    (event,) = window_events(store)
    assert event.severity == "info"
    assert event.data["before"] == "office-hours" and event.data["after"] is None
    assert event.data["changes"] == [
        {"key": "markets", "before": "[on_demand]", "after": "[spot, on_demand]"}
    ]
    assert event.message.endswith("train on aws/us-east-1/use1-az1/g5.xlarge/spot: still allowed")


def test_a_boundary_passed_while_no_replica_watched_is_alerted_within_the_look_back(
    store: Store,
) -> None:
    running_job(store)
    WindowWatch()(context(store, OPENS + timedelta(minutes=9)))
    assert len(window_events(store)) == 1
    WindowWatch()(context(store, CLOSES + timedelta(minutes=11)))  # past the look-back
    assert len(window_events(store)) == 1
