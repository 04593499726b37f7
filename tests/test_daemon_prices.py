"""Price signals after each poll, and the poll loop that records price history."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from optimizer.alerts import Emitter, Router
from optimizer.clock import ManualClock
from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.loops.poll import PollLoop
from optimizer.daemon.loops.watch import PolicyWatcher
from optimizer.daemon.metrics import Metrics
from optimizer.daemon.policies import PolicyRegistry
from optimizer.daemon.prices import PriceState, PriceWatch, price_signals
from optimizer.daemon.providers import ProviderHandle
from optimizer.model import Market
from optimizer.store import Store
from policies.engine import evaluate
from policies.loader import parse_policy
from providers.base import AuthError, ProviderDisabled
from tests.helpers import T0, FakeSource, make_offer, policy_text, write_policy

pytestmark = pytest.mark.usefixtures("daemon_env")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


CAPPED = parse_policy(policy_text("capped", cap=0.5))
PLAIN = parse_policy(policy_text("plain"))


def step(previous, offers, policy=PLAIN, sha="v1", now=T0):
    ranking = evaluate(policy, offers, now)
    capped = policy.bid.max_usd_per_hour is not None
    return price_signals(policy.name, sha, ranking, previous, drop_fraction=0.2, capped=capped)


def test_the_first_evaluation_sets_a_baseline_and_says_nothing() -> None:
    signals, state = step(None, [make_offer(usd_per_hour=0.4)])
    assert signals == []
    assert (state.best_usd, state.reference_usd) == (0.4, 0.4)


def test_a_new_best_pool_is_reported_with_both_prices() -> None:
    _, state = step(None, [make_offer(usd_per_hour=0.4)])
    cheaper_zone = make_offer(zone="use1-az9", usd_per_hour=0.39)
    [signal], state = step(state, [make_offer(usd_per_hour=0.4), cheaper_zone])
    assert signal.kind == "best_offer.changed" and signal.severity == "info"
    assert signal.data["price_before"] == 0.4 and signal.data["price_after"] == 0.39
    assert signal.data["pool_after"] == "aws/us-east-1/use1-az9/g5.xlarge/spot"
    assert "best offer is now aws us-east-1 (use1-az9) g5.xlarge spot at $0.3900/h" in (
        signal.message
    )
    assert step(state, [make_offer(usd_per_hour=0.4), cheaper_zone])[0] == []


def test_the_same_pool_alerts_once_it_is_more_than_20_percent_below_its_reference() -> None:
    _, state = step(None, [make_offer(usd_per_hour=1.0)])
    signals, state = step(state, [make_offer(usd_per_hour=0.9)])  # -10%: quiet
    assert signals == [] and state.reference_usd == 1.0
    [drop], state = step(state, [make_offer(usd_per_hour=0.79)])  # -21% from 1.0
    assert drop.kind == "price.dropped" and drop.data["price_before"] == 1.0
    assert state.reference_usd == 0.79
    signals, state = step(state, [make_offer(usd_per_hour=1.2)])  # a rise moves the reference up
    assert signals == [] and state.reference_usd == 1.2
    [drop], _ = step(state, [make_offer(usd_per_hour=0.95)])  # -20.8% from 1.2
    assert drop.data["price_before"] == 1.2


def test_losing_every_candidate_is_a_warning() -> None:
    _, state = step(None, [make_offer()])
    [signal], state = step(state, [make_offer(gpu_memory_gib=8, gpu_model="T4G")])
    assert (signal.kind, signal.severity) == ("best_offer.lost", "warning")
    assert state.best_pool is None
    [back], _ = step(state, [make_offer()])
    assert back.kind == "best_offer.changed" and back.data["price_before"] is None


def test_spot_prices_crossing_the_bid_cap_raise_one_event_per_direction() -> None:
    pools = [make_offer(zone=f"use1-az{i}", usd_per_hour=0.45) for i in range(3)]
    _, state = step(None, pools, CAPPED)
    assert {side for side, _ in state.caps.values()} == {"under"}
    risen = [pools[0], *(make_offer(zone=p.zone, usd_per_hour=0.55) for p in pools[1:])]
    signals, state = step(state, risen, CAPPED)
    [above] = [s for s in signals if s.kind == "bid_cap.crossed"]
    assert above.severity == "warning" and above.data["direction"] == "above"
    assert [p["pool"] for p in above.data["pools"]] == [
        "aws/us-east-1/use1-az1/g5.xlarge/spot",
        "aws/us-east-1/use1-az2/g5.xlarge/spot",
    ]
    assert above.data["price_before"] == 0.45 and above.data["price_after"] == 0.55
    assert "2 spot pools moved above the bid cap" in above.message
    signals, state = step(state, risen, CAPPED)
    assert signals == []  # still above: not a new crossing
    signals, _ = step(state, pools, CAPPED)
    [below] = [s for s in signals if s.kind == "bid_cap.crossed"]
    assert below.severity == "info" and below.data["direction"] == "below"


def test_a_new_policy_version_starts_a_new_baseline() -> None:
    _, state = step(None, [make_offer(usd_per_hour=1.0)], sha="v1")
    cheaper_zone = make_offer(zone="use1-az9", usd_per_hour=0.5)
    signals, state = step(state, [make_offer(usd_per_hour=1.0), cheaper_zone], sha="v2")
    assert signals == [] and state == PriceState("v2", state.best_pool, 0.5, 0.5, {})
    assert state.best_pool == "aws/us-east-1/use1-az9/g5.xlarge/spot"


def test_a_version_that_nothing_satisfies_is_lost_at_once_and_found_again() -> None:
    offers = [make_offer(usd_per_hour=1.0)]
    _, state = step(None, offers, sha="v1")
    tight = parse_policy(policy_text("plain", memory=1000))
    [lost], state = step(state, offers, tight, sha="v2")
    assert (lost.kind, lost.severity) == ("best_offer.lost", "warning")
    pool = "aws/us-east-1/use1-az1/g5.xlarge/spot"
    assert lost.data == {"pool_before": pool, "price_before": 1.0}
    assert "no offer satisfies it since its edit" in lost.message
    assert state == PriceState("v2")
    assert step(state, offers, tight, sha="v2")[0] == []  # still lost: said once
    [found], state = step(state, offers, sha="v3")
    assert found.kind == "best_offer.changed" and found.data["pool_before"] is None
    assert state.best_usd == 1.0


@pytest.fixture
def parts(tmp_path: Path, clock: ManualClock):
    store = Store(f"sqlite:///{tmp_path / 'p.db'}", clock=clock)
    store.create_all()
    registry = PolicyRegistry()
    emitter = Emitter(store.events, Router([], ["ops"]))
    write_policy(tmp_path / "policies", "plain.yaml", policy_text("plain"))
    PolicyWatcher(tmp_path / "policies", registry, store, emitter, clock).run_once()
    yield store, registry, emitter
    store.close()


def test_polls_record_new_observations_and_price_events_reach_the_outbox(
    parts, clock: ManualClock
) -> None:
    store, registry, emitter = parts
    source = FakeSource([make_offer(usd_per_hour=1.0, observed_at=clock())])
    metrics = Metrics()
    watch = PriceWatch(store, registry, emitter)
    handle = ProviderHandle.given("aws", ProviderConfig(), source)
    poll = PollLoop(
        handle, Market.SPOT, store, emitter, clock, metrics=metrics, after=watch.evaluate
    )
    assert poll.run_once().recorded == 1
    assert poll.run_once().recorded == 0  # the same observation again adds no history
    clock.advance(600)
    source.offers = [make_offer(usd_per_hour=0.7, observed_at=clock())]
    assert poll.run_once().recorded == 1
    history = store.prices.price_history("aws", "us-east-1", "use1-az1", "g5.xlarge", "spot")
    assert [usd for _, usd in history] == [1.0, 0.7]
    [drop] = [a for a in store.events.due_alerts(clock()) if a.event.kind == "price.dropped"]
    assert drop.event.policy == "plain" and drop.event.data["price_after"] == 0.7
    labels = {"provider": "aws", "region": "*", "market": "spot"}
    assert metrics.sample("gpuopt_poll_offers", labels) == 1
    assert metrics.sample("gpuopt_poll_last_success_timestamp_seconds", labels) == (
        clock().timestamp()
    )


def test_a_failing_provider_is_reported_once_and_its_recovery_too(
    parts, clock: ManualClock
) -> None:
    store, _, emitter = parts
    source = FakeSource([make_offer(observed_at=clock())])
    config = ProviderConfig(regions=["us-east-1", "eu-west-1"])
    metrics = Metrics()
    handle = ProviderHandle.given("aws", config, source)
    poll = PollLoop(handle, Market.SPOT, store, emitter, clock, metrics=metrics)
    source.error = AuthError("credentials expired", provider="aws")
    for _ in range(3):
        report = poll.run_once()
        clock.advance(60)
    assert report.failed_regions == ("us-east-1", "eu-west-1")
    statuses = {s.region: s for s in store.policies.poll_statuses()}
    assert statuses["us-east-1"].failures == 3
    assert statuses["us-east-1"].last_error == "AuthError: credentials expired"
    failed = store.events.list_events(kind="poll.failed")
    assert sorted(e.data["region"] for e in failed) == ["eu-west-1", "us-east-1"]
    labels = {"provider": "aws", "region": "us-east-1", "market": "spot", "error": "AuthError"}
    assert metrics.sample("gpuopt_poll_errors_total", labels) == 3

    source.error = None
    poll.run_once()
    assert {s.failures for s in store.policies.poll_statuses()} == {0}
    assert len(store.events.list_events(kind="poll.recovered")) == 2


def test_a_disabled_provider_says_why(parts, clock: ManualClock) -> None:
    store, _, emitter = parts

    def build():
        raise ProviderDisabled("no GCP project: set GPUOPT_GCP_PROJECT", provider="gcp")

    poll = PollLoop(
        ProviderHandle("gcp", ProviderConfig(), build), Market.SPOT, store, emitter, clock
    )
    poll.run_once()
    [event] = store.events.list_events(kind="provider.disabled")
    assert event.message == (
        "gcp spot poll failed: ProviderDisabled: no GCP project: set GPUOPT_GCP_PROJECT"
    )
    assert event.severity == "warning"
    assert store.policies.poll_statuses()[0].last_ok_at is None
    assert clock() - store.policies.poll_statuses()[0].last_run_at == timedelta(0)


def test_a_credential_in_a_provider_error_is_redacted(parts, clock: ManualClock) -> None:
    store, _, emitter = parts
    source = FakeSource()
    source.error = AuthError("bad key AIzaSy-secret-key-123 for billing", provider="gcp")
    handle = ProviderHandle.given("gcp", ProviderConfig(), source)
    poll = PollLoop(handle, Market.SPOT, store, emitter, clock, secrets=["AIzaSy-secret-key-123"])
    poll.run_once()
    [event] = store.events.list_events(kind="poll.failed")
    assert "AIzaSy" not in event.message and "bad key *** for billing" in event.message
    assert "AIzaSy" not in (store.policies.poll_statuses()[0].last_error or "")
