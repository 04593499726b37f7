"""Probe results feed the daemon's ranking: the launch ranking reads the stored medians, a type
whose probes keep failing on a provider is ranked after healthy types, and its alert is raised
once per failure streak (not on every pass, not on a second replica); the price signals after
a poll rank on the measured figures as well."""

from __future__ import annotations

from datetime import datetime, timedelta

from optimizer.alerts.outbox import Emitter
from optimizer.alerts.routing import Router
from optimizer.daemon.loops.watch import PolicyWatcher
from optimizer.daemon.policies import PolicyRegistry
from optimizer.daemon.prices import PriceWatch
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.measured import ProbeFailureWatch, ProbeWindow
from optimizer.jobs.ranking import launch_ranking
from optimizer.model import EventKind, Interconnect, Market
from optimizer.store import Store
from policies.schema import Policy
from tests.helpers import T0, make_offer, write_policy
from tests.helpers.probes import attempt_of, probe_json, report

KIND = EventKind.INSTANCE_TYPE_DEMOTED
NOW = T0 + timedelta(hours=1)


def node(kind: str, model: str, usd: float):
    return make_offer(
        provider="aws",
        region="us-east-1",
        zone="us-east-1a",
        instance_type=kind,
        gpu_model=model,
        gpu_count=8,
        gpu_memory_gib=80.0,
        interconnect=Interconnect.NVLINK,
        market=Market.ON_DEMAND,
        usd_per_hour=usd,
        observed_at=T0,
    )


def policy(rank_by: str = "price") -> Policy:
    return Policy.model_validate(
        {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "p", "rank_by": rank_by}
    )


def context(store: Store, now: datetime) -> ReconcileContext:
    emitter = Emitter(store.events, Router([], ["ops"]))
    return ReconcileContext(
        now=now, jobs=(), policies={}, store=store, providers={}, emitter=emitter, clock=lambda: now
    )


def probes(store: Store, kind: str, outcomes: str, start: datetime, job: str = "j") -> None:
    """Report one probe per letter (p: pass, f: fail), a minute apart, each on a new attempt."""
    for i, letter in enumerate(outcomes):
        a = attempt_of(store, f"{job}-{kind}-{start.minute}-{i}", kind=kind)
        status = "pass" if letter == "p" else "fail"
        report(store, a, f"{a.key}-probe", status, probe_json(300.0), start + timedelta(minutes=i))


def test_the_launch_ranking_reads_the_stored_medians_and_reverses_the_datasheet(
    store: Store,
) -> None:
    a100, h100 = node("p4de.24xlarge", "A100-80GB", 20.0), node("p5.48xlarge", "H100-80GB", 40.0)
    store.prices.record_offers([a100, h100])
    before = launch_ranking(store, "p", policy("price_per_tflop"), NOW).ranking
    assert [c.offer.instance_type for c in before.candidates] == ["p5.48xlarge", "p4de.24xlarge"]
    # Three probes of the H100 type measured 300 TFLOPS bf16 per GPU: $40 / 2400 > $20 / 2496.
    probes(store, "p5.48xlarge", "ppp", T0)
    after = launch_ranking(store, "p", policy("price_per_tflop"), NOW).ranking
    assert [c.offer.instance_type for c in after.candidates] == ["p4de.24xlarge", "p5.48xlarge"]
    measured = after.candidates[1]
    assert (measured.throughput, measured.measured_n, measured.node_tflops) == (
        "measured",
        3,
        2400.0,
    )
    assert measured.measured_age_s == (NOW - (T0 + timedelta(minutes=2))).total_seconds()


def test_a_type_that_keeps_failing_is_demoted_and_alerted_once_per_streak(store: Store) -> None:
    cheap, dear = node("p4d.24xlarge", "A100-40GB", 10.0), node("p4de.24xlarge", "A100-80GB", 20.0)
    store.prices.record_offers([cheap, dear])
    window = ProbeWindow(last=5, demote_failed=3)
    probes(store, "p4d.24xlarge", "ffpp", T0)  # two failures of four: not yet
    watch = ProbeFailureWatch(window)
    watch(context(store, NOW))
    assert store.events.of_kind(KIND, T0) == []
    ranking = launch_ranking(store, "p", policy(), NOW, window=window).ranking
    assert [c.offer.instance_type for c in ranking.candidates] == ["p4d.24xlarge", "p4de.24xlarge"]

    probes(store, "p4d.24xlarge", "f", T0 + timedelta(minutes=10))  # 3 of the last 5 failed
    watch(context(store, NOW))
    watch(context(store, NOW + timedelta(minutes=1)))  # the next pass
    ProbeFailureWatch(window)(context(store, NOW + timedelta(minutes=2)))  # another replica
    [event] = store.events.of_kind(KIND, T0)
    assert event.severity == "warning"
    assert event.data == {
        "provider": "aws",
        "instance_type": "p4d.24xlarge",
        "failed": 3,
        "of": 5,
        "since": T0.isoformat(),
    }
    assert [a["channel"] for a in store.events.list_alerts()] == ["ops"]
    ranking = launch_ranking(store, "p", policy(), NOW, window=window).ranking
    assert [c.offer.instance_type for c in ranking.candidates] == ["p4de.24xlarge", "p4d.24xlarge"]
    demoted = ranking.candidates[1]
    assert demoted.probe_failures == (
        "probe_failures: 3 of the last 5 probes of p4d.24xlarge on aws failed "
        "(since 2026-01-15T12:00:00Z)"
    )

    # Passing probes push the failures out of the window: healthy again, no alert.
    probes(store, "p4d.24xlarge", "ppp", T0 + timedelta(minutes=20))
    watch(context(store, NOW + timedelta(minutes=3)))
    ranking = launch_ranking(store, "p", policy(), NOW, window=window).ranking
    assert ranking.candidates[0].offer.instance_type == "p4d.24xlarge"
    assert ranking.candidates[0].probe_failures is None
    # A new streak alerts again.
    probes(store, "p4d.24xlarge", "fff", T0 + timedelta(minutes=30))
    watch(context(store, NOW + timedelta(minutes=4)))
    assert len(store.events.of_kind(KIND, T0)) == 2


def test_the_price_signals_rank_on_the_measured_figures_too(store: Store, tmp_path) -> None:
    registry = PolicyRegistry()
    emitter = Emitter(store.events, Router([], ["ops"]))
    text = "apiVersion: gpuopt/v1\nkind: Policy\nname: perflop\nrank_by: price_per_tflop\n"
    write_policy(tmp_path / "policies", "perflop.yaml", text)
    PolicyWatcher(tmp_path / "policies", registry, store, emitter, lambda: NOW).run_once()
    store.prices.record_offers(
        [node("p4de.24xlarge", "A100-80GB", 20.0), node("p5.48xlarge", "H100-80GB", 40.0)]
    )
    watch = PriceWatch(store, registry, emitter)
    watch.evaluate(NOW)  # the baseline: the H100 node, by the datasheet
    assert store.events.of_kind(EventKind.BEST_OFFER_CHANGED, T0) == []
    probes(store, "p5.48xlarge", "ppp", T0)  # it measures 300 TFLOPS a GPU
    watch.evaluate(NOW + timedelta(minutes=1))
    [changed] = store.events.of_kind(EventKind.BEST_OFFER_CHANGED, T0)
    assert changed.policy == "perflop"
    assert "p4de.24xlarge" in changed.data["pool_after"]
    assert "p5.48xlarge" in changed.data["pool_before"]
