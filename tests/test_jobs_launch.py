"""The launch walk and its typed outcomes: what each launch error costs, and who retries."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs import budget as job_budget
from optimizer.jobs import spec as spec_module
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.launch import LaunchOutcome
from optimizer.jobs.machine import Launch
from optimizer.jobs.reconcile import JobReconciler
from optimizer.jobs.recovery import Failover, RecoverySettings
from optimizer.store import JobRecord, Store
from policies.engine import evaluate
from policies.loader import parse_policy
from providers.base import AuthError, CapacityError, InstanceRef, QuotaError, ThrottledError
from tests.helpers import make_offer
from tests.helpers.jobs import Drafter

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
POLICY = parse_policy(
    "apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {gpus: 1, gpu_memory_gib: 16}\n"
    "recovery: {quota_cooldown_minutes: 30, auth_cooldown_minutes: 90}\n"
)
STRATEGY = Failover(
    RecoverySettings(quota_cooldown=timedelta(minutes=30), auth_cooldown=timedelta(minutes=90))
)
# cheapest first: two zones of us-east-1, then us-west-2
EAST_A = make_offer(zone="use1-az1", usd_per_hour=0.40, observed_at=NOW)
EAST_B = make_offer(zone="use1-az2", usd_per_hour=0.45, observed_at=NOW)
WEST = make_offer(region="us-west-2", zone="usw2-az1", usd_per_hour=0.50, observed_at=NOW)
EAST_A_POOL = ("aws", "us-east-1", "use1-az1", "g5.xlarge", "spot")


class FlakySource:
    """A provider whose launches raise the given errors in turn, then succeed."""

    name = "aws"

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.launched: list[tuple[str | None, str]] = []  # (zone, key) of every call
        self.specs: list[Any] = []

    def launch(self, offer: Any, spec: Any, key: str) -> InstanceRef:
        self.launched.append((offer.zone, key))
        self.specs.append(spec)
        if self.errors:
            raise self.errors.pop(0)
        return InstanceRef("aws", offer.region, offer.zone, f"i-{key}")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    store.prices.record_offers([EAST_A, EAST_B, WEST])
    store.jobs.add_job("j", "p", {"run": "x", "checkpoint_dir": "/c"})
    yield store
    store.close()


def context(
    store: Store,
    source: FlakySource | None,
    *,
    leading: Iterator[bool] | None = None,
    now: datetime = NOW,
) -> ReconcileContext:
    providers: Mapping[str, Any] = {} if source is None else {"aws": _handle(source)}
    job = store.jobs.get_job("j")
    assert job is not None
    return ReconcileContext(
        now=now,
        jobs=(job,),
        policies={"p": SimpleNamespace(policy=POLICY)},
        store=store,
        providers=providers,
        emitter=Drafter(),
        clock=lambda: now,
        leading=(lambda: next(leading, True)) if leading is not None else (lambda: True),
    )


def _handle(source: FlakySource) -> Any:
    return ProviderHandle.given("aws", ProviderConfig(), source)  # type: ignore[arg-type]


def job_of(store: Store) -> JobRecord:
    job = store.jobs.get_job("j")
    assert job is not None
    return job


def walk(reconciler: JobReconciler, ctx: ReconcileContext) -> tuple[bool, str]:
    return reconciler.launcher.walk(ctx, job_of(ctx.store), Launch(), POLICY, STRATEGY)


def test_capacity_cools_the_pool_and_tries_the_next_offer_at_once(store: Store) -> None:
    source = FlakySource(CapacityError("none left"))
    launched, why = walk(JobReconciler(lambda: "http://d"), context(store, source))
    assert launched and why.startswith("launched attempt 2 on aws us-east-1/use1-az2")
    first, second = store.jobs.attempts(job_of(store).id)
    assert first.end_reason == "capacity" and second.instance_id == "i-1-2"
    assert store.jobs.cooled_pools(NOW + timedelta(minutes=9)) == {first.pool}  # pool_cooldown 10
    assert store.jobs.cooled_pools(NOW + timedelta(minutes=10)) == set()


def test_quota_cools_the_pool_for_the_quota_cooldown_and_skips_its_region(store: Store) -> None:
    source = FlakySource(QuotaError("limit reached"))
    reconciler = JobReconciler(lambda: "http://d")
    launched, why = walk(reconciler, context(store, source))
    assert launched and "us-west-2" in why
    assert [zone for zone, _key in source.launched] == ["use1-az1", "usw2-az1"]  # az2 skipped
    assert store.jobs.cooled_pools(NOW + timedelta(minutes=29)) == {EAST_A_POOL}
    assert store.jobs.cooled_pools(NOW + timedelta(minutes=30)) == set()
    assert [e.kind for e in reconciler.acting.buffer] == ["provider.quota_exceeded"]


def test_auth_benches_the_provider_for_the_auth_cooldown(store: Store) -> None:
    source = FlakySource(AuthError("bad key"))
    reconciler = JobReconciler(lambda: "http://d")
    launched, why = walk(reconciler, context(store, source))
    assert not launched and "failed to launch" in why
    assert source.launched == [("use1-az1", "1-1")]  # one call, then aws sat out
    assert reconciler.launcher.disabled == {"aws": NOW + timedelta(minutes=90)}
    [alert] = reconciler.acting.buffer
    assert alert.kind == "provider.auth_failed" and alert.message.endswith(
        "no launches on aws for 1.5 h"
    )
    later = context(store, source, now=NOW + timedelta(minutes=90))
    assert reconciler.launcher.provider(later, "aws") is source


def test_throttling_leaves_the_attempt_launching_for_the_next_pass(store: Store) -> None:
    source = FlakySource(ThrottledError("slow down"))
    reconciler = JobReconciler(lambda: "http://d")
    launched, why = walk(reconciler, context(store, source))
    assert launched and why.endswith("(throttled; retrying)")
    [attempt] = store.jobs.attempts(job_of(store).id)
    assert attempt.state == "launching" and attempt.instance_id is None
    outcome = reconciler.launcher.launch(context(store, source), job_of(store), attempt, STRATEGY)
    assert outcome is LaunchOutcome.LAUNCHED
    assert [key for _zone, key in source.launched] == ["1-1", "1-1"]  # the same key


def test_losing_the_lead_mid_walk_is_not_reported_as_throttling(store: Store) -> None:
    """The attempt row is written, then the lease is lost before the call: the attempt stays
    'launching' for the new leader, and the job's reason says so (it used to say throttled)."""
    source = FlakySource()
    reconciler = JobReconciler(lambda: "http://d")
    reconciler(context(store, source, leading=iter([True, False])))
    job = job_of(store)
    assert job.state == "provisioning" and "stopped leading" in job.reason
    assert "throttled" not in job.reason
    [attempt] = store.jobs.attempts(job.id)
    assert attempt.state == "launching" and source.launched == []
    # the new leader's pass retries the same key
    JobReconciler(lambda: "http://d")(context(store, source))
    assert source.launched == [("use1-az1", attempt.key)]
    assert store.jobs.attempts(job.id)[0].instance_id == f"i-{attempt.key}"


def test_a_retry_whose_provider_is_gone_ends_the_attempt(store: Store) -> None:
    source = FlakySource(ThrottledError("slow down"))
    reconciler = JobReconciler(lambda: "http://d")
    walk(reconciler, context(store, source))
    [attempt] = store.jobs.attempts(job_of(store).id)
    outcome = reconciler.launcher.launch(context(store, None), job_of(store), attempt, STRATEGY)
    assert outcome is LaunchOutcome.NO_PROVIDER and outcome.skips_scope
    ended = store.jobs.attempt(attempt.key)
    assert ended is not None and ended.end_reason == "provider unavailable" and ended.ended


def test_a_retry_whose_offer_is_no_longer_listed_ends_the_attempt(store: Store) -> None:
    source = FlakySource(ThrottledError("slow down"))
    reconciler = JobReconciler(lambda: "http://d")
    walk(reconciler, context(store, source))
    [attempt] = store.jobs.attempts(job_of(store).id)
    unlisted = replace(attempt, zone="use1-az9")  # a pool the store lists no offer for
    outcome = reconciler.launcher.launch(context(store, source), job_of(store), unlisted, STRATEGY)
    assert outcome is LaunchOutcome.OFFER_GONE and not outcome.pending
    ended = store.jobs.attempt(attempt.key)
    assert ended is not None and ended.end_reason == "offer gone"


# NOW is 2026-11-30 12:00 UTC: 12 h left in November.
def budget_policy(monthly_usd: float) -> Any:
    return parse_policy(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {gpus: 1, gpu_memory_gib: 16}\n"
        f"budget: {{monthly_usd: {monthly_usd}}}\n"
    )


def test_two_concurrent_jobs_under_one_budget_do_not_overshoot(store: Store) -> None:
    # $7 a month: one job at $0.40/h to the month's end ($4.80) fits, two ($9.60) do not,
    # though what is spent so far plus the second launch alone ($4.80) would.
    policy = budget_policy(7)
    store.jobs.add_job("k", "p", {"run": "x", "checkpoint_dir": "/k"})
    reconciler = JobReconciler(lambda: "http://d")
    ctx = context(store, FlakySource())
    first = store.jobs.get_job("j")
    second = store.jobs.get_job("k")
    assert first is not None and second is not None
    launched, _ = reconciler.launcher.walk(ctx, first, Launch(), policy, STRATEGY)
    assert launched
    launched, why = reconciler.launcher.walk(ctx, second, Launch(), policy, STRATEGY)
    assert not launched
    # the first attempt's instance bills its 60 s minimum from its launch: $0.0067 spent
    assert why == (
        "budget: $0.01 spent this month under policy p, 1 attempt(s) running; the cheapest "
        "launch projects $9.61 > $7.00"
    )
    assert store.jobs.attempts(second.id) == []
    live = [a for a in store.jobs.policy_attempts("p", NOW) if a.ended_at is None]
    assert sum(a.usd_per_hour for a in live) * 12 <= 7


def test_a_jobs_own_live_attempt_does_not_hold_back_its_replacement(store: Store) -> None:
    # An interrupted attempt still running out its notice is being replaced: it counts for
    # what it spent, not for the rest of the month.
    policy = budget_policy(7)
    reconciler = JobReconciler(lambda: "http://d")
    ctx = context(store, FlakySource())
    job = job_of(store)
    assert reconciler.launcher.walk(ctx, job, Launch(), policy, STRATEGY)[0]
    launched, why = reconciler.launcher.walk(ctx, job, Launch(), policy, STRATEGY)
    assert launched, why


@pytest.mark.parametrize("cap", [4.0, 9.5, 10.5, 11.0, 100.0])
def test_the_ranking_and_the_launch_check_agree(store: Store, cap: float) -> None:
    # Job j runs at $0.40/h; what job k may launch on, by the launch walk and by the ranking
    # of the same policy over the same offers, spend and instant (as GET /offers shows it).
    policy = budget_policy(cap)
    store.jobs.add_job("k", "p", {"run": "x", "checkpoint_dir": "/k"})
    reconciler = JobReconciler(lambda: "http://d")
    source = FlakySource()
    ctx = context(store, source)
    first = job_of(store)
    if cap > 4.8:
        assert reconciler.launcher.walk(ctx, first, Launch(), policy, STRATEGY)[0]
    offers = store.prices.latest_offers()
    spend = job_budget.committed(store, "p", NOW, offers)
    ranking = evaluate(policy, offers, NOW, committed=spend)
    second = store.jobs.get_job("k")
    assert second is not None
    launched, _ = reconciler.launcher.walk(ctx, second, Launch(), policy, STRATEGY)
    assert launched == bool(ranking.candidates)
    if launched:
        assert ranking.best is not None
        (attempt,) = store.jobs.attempts(second.id)
        assert attempt.pool == ranking.best.offer.pool
    else:
        assert store.jobs.attempts(second.id) == []
        assert ranking.rejection_counts() == {"budget": 3}


def test_the_bootstrap_comes_from_the_agent_settings_and_expects_the_offers_gpus(
    store: Store,
) -> None:
    from optimizer.jobs.bootstrap import AgentInstall, AgentSettings

    source = FlakySource()
    agent = AgentSettings(
        install=AgentInstall(version="0.4.1", venv="/srv/gpuopt"),
        images={"aws": "ami-0123456789abcdef0"},
        env={"HF_HOME": "/data/hf"},
    )
    reconciler = JobReconciler(lambda: "http://d", agent=agent)
    assert walk(reconciler, context(store, source))[0]
    [spec] = source.specs
    assert spec.image == "ami-0123456789abcdef0"
    assert f"export GPUOPT_EXPECTED_GPUS={EAST_A.gpu_count}\n" in spec.bootstrap
    assert "export HF_HOME=/data/hf\n" in spec.bootstrap
    assert "/srv/gpuopt/bin/python -m pip install" in spec.bootstrap
    assert "'gpuopt[probes]==0.4.1'" in spec.bootstrap
    assert spec.bootstrap.endswith("exec /srv/gpuopt/bin/python -m optimizer.agent\n")


def test_one_walk_launches_a_single_node_as_a_gang_of_one(store: Store) -> None:
    """A single node's try is the gang walk's with one node: its row keeps the single-node
    key and no gang, a failed node ends its own row, and no gang is torn down."""
    source = FlakySource(CapacityError("none left"))
    reconciler = JobReconciler(lambda: "http://d")
    launched, why = walk(reconciler, context(store, source))
    assert launched
    assert why == "launched attempt 2 on aws us-east-1/use1-az2 g5.xlarge spot at $0.4500/h"
    job = job_of(store)
    first, second = store.jobs.attempts(job.id)
    assert (first.key, first.gang, first.node_rank, first.nodes) == (f"{job.id}-1", None, 0, 1)
    assert (second.key, second.gang, second.nodes) == (f"{job.id}-2", None, 1)
    assert [e.message for e in reconciler.acting.buffer] == [
        "no capacity on aws us-east-1/use1-az1 g5.xlarge spot; trying the next offer"
    ]


def test_a_lost_lead_mid_walk_keeps_each_shapes_words(store: Store) -> None:
    """The job's reason when the lead is lost before a node's call, as the single-node and
    the gang walks always worded it."""
    reconciler = JobReconciler(lambda: "http://d")
    ctx = context(store, FlakySource(), leading=iter([True, False]))
    launched, why = reconciler.launcher.walk(ctx, job_of(store), Launch(), POLICY, STRATEGY)
    assert launched and why == (
        "launching attempt 1 on aws us-east-1/use1-az1 g5.xlarge spot at $0.4000/h "
        "(this replica stopped leading; the new leader retries)"
    )
    store.jobs.add_job("g", "p", {"run": "x", "checkpoint_dir": "/g", "nodes": 2})
    gang = store.jobs.get_job("g")
    assert gang is not None
    ctx = context(store, FlakySource(), leading=iter([True, True, False]))
    launched, why = reconciler.launcher.walk(ctx, gang, Launch(), POLICY, STRATEGY)
    assert launched and why == (
        "launching attempt 1 (2 nodes) on aws us-east-1/use1-az1 g5.xlarge spot at "
        "$0.4000/h each (not_leader; retrying)"
    )
    rows = store.jobs.attempts(gang.id)
    assert [(a.gang, a.node_rank, a.nodes, a.instance_id is not None) for a in rows] == [
        (1, 0, 2, True),
        (1, 1, 2, False),
    ]


def test_a_pass_reads_offers_probe_figures_and_specs_once_yet_each_launch_sees_new_cooldowns(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three pending jobs of one policy in one pass: the first launch's capacity error cools
    # its pool, and the two launches after it keep away from that pool, though the pass read
    # the latest offers and the probe figures once for all three.
    for name in ("k", "l"):
        store.jobs.add_job(name, "p", {"run": "x", "checkpoint_dir": f"/{name}"})
    reads = {"latest_offers": 0, "figures": 0, "attempts": 0}

    def counted(target: Any, method: str) -> None:
        original = getattr(target, method)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            reads[method] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(target, method, wrapper)

    counted(store.prices, "latest_offers")
    counted(store.probes, "figures")
    counted(store.jobs, "attempts")
    validated: list[str] = []  # each stored spec validated, by job name
    from_stored = spec_module.from_stored

    def validating(stored: Any, *, name: str, policy: str) -> Any:
        validated.append(name)
        return from_stored(stored, name=name, policy=policy)

    monkeypatch.setattr(spec_module, "from_stored", validating)
    source = FlakySource(CapacityError("none left"))
    ctx = replace(context(store, source), jobs=tuple(store.jobs.live_jobs()))
    JobReconciler(lambda: "http://d")(ctx)

    assert [zone for zone, _ in source.launched] == ["use1-az1", "use1-az2", "use1-az2", "use1-az2"]
    # A job's attempts: once per launch, to name the one just written; the attempt's number
    # comes from the attempts the pass read.
    assert reads == {"latest_offers": 1, "figures": 1, "attempts": 3}
    assert sorted(validated) == ["j", "k", "l"]  # once per job, not per use in its launch
    launched = [a for job in ctx.jobs for a in store.jobs.attempts(job.id) if not a.ended]
    assert len(launched) == 3 and all(a.zone == "use1-az2" for a in launched)


def test_the_walk_caps_each_node_in_the_cloud_with_the_bid_it_was_handed(store: Store) -> None:
    # The walk's policy enforces its bid in the cloud; the context's copy of policy p does
    # not: each node's cap comes from the walk's own policy, not from a lookup of the job's.
    policy = parse_policy(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {gpus: 1, gpu_memory_gib: 16}\n"
        "bid: {max_usd_per_hour: 1.25, enforce_in_cloud: true}\n"
    )
    source = FlakySource()
    ctx = context(store, source)
    launched, why = JobReconciler(lambda: "http://d").launcher.walk(
        ctx, job_of(store), Launch(), policy, STRATEGY
    )
    assert launched, why
    assert [spec.max_usd_per_hour for spec in source.specs] == [1.25]
