"""A gang of N nodes costs N instances wherever a launch meets the budget: the model, the
ranking's budget rule (both of the engine's paths), the launch walk's check and the month's
projection of live attempts gathered from the store. Every figure is worked by hand."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs import budget as job_budget
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.machine import Launch
from optimizer.jobs.reconcile import JobReconciler
from optimizer.jobs.recovery import Failover
from optimizer.store import Store
from policies import budget
from policies.budget import Committed, Live
from policies.engine import evaluate
from policies.loader import parse_policy
from providers.base import InstanceRef
from tests.helpers import make_offer
from tests.helpers.jobs import Drafter

APRIL = datetime(2026, 4, 23, 12, tzinfo=UTC)  # 180 h to the end of April
NOVEMBER = datetime(2026, 11, 30, 12, tzinfo=UTC)  # 12 h to the end of November


def policy(nodes: int, monthly_usd: float) -> Any:
    return parse_policy(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: p\n"
        f"workload: {{gpus: 1, nodes: {nodes}}}\nbudget: {{monthly_usd: {monthly_usd}}}\n"
    )


def test_a_live_gang_is_one_attempt_of_n_instances_and_a_gang_launch_projects_n() -> None:
    # A gang of 3 at $2/h (listed at $2.50/h now) and a single node at $1/h; $50 spent.
    spend = budget.committed(50.0, [Live(2.0, 2.5, instances=3), Live(1.0)])
    assert spend == Committed(50.0, live_usd_per_hour=8.5, live_attempts=2, live_instances=4)
    # + a 2-node launch at $4/h for 180 h: 50 + (8.5 + 2 x 4) x 180 = 3020
    assert budget.projected(spend, 4.0, APRIL, instances=2) == pytest.approx(3020.0)
    assert budget.projected(spend, 4.0, APRIL) == pytest.approx(50 + 12.5 * 180)
    assert budget.live_text(spend) == "2 live (4 instances)"
    assert budget.live_text(budget.committed(0.0, [Live(1.0), Live(1.0)])) == "2 live"


def test_the_budget_rule_prices_every_node_of_a_gang() -> None:
    # $5,000 a month, 180 h left: one node at $14/h projects $2,520 (fits); two project
    # 2 x 14 x 180 = $5,040 (do not); two at $13/h project $4,680 (fit).
    single, pair = policy(1, 5000), policy(2, 5000)
    at_14, at_13 = make_offer(usd_per_hour=14.0), make_offer(usd_per_hour=13.0)
    assert evaluate(single, [at_14], APRIL).candidates
    assert evaluate(pair, [at_13], APRIL).candidates
    (rejected,) = evaluate(pair, [at_14], APRIL).rejections
    assert (rejected.rule, rejected.reason) == (
        "budget",
        "projected $5,040.00 this month ($0.00 spent + 2 nodes x $14/h, for 180.0 h) "
        "> budget $5,000.00/month",
    )


def test_the_budget_rule_counts_a_live_gang_once_as_an_attempt_at_every_nodes_price() -> None:
    # $100 spent; a live gang of 2 at $10/h each ($20/h). A 2-node launch at $2/h:
    # 100 + (20 + 4) x 180 = $4,420 fits; at $4/h: 100 + (20 + 8) x 180 = $5,140 does not.
    spend = budget.committed(100.0, [Live(10.0, instances=2)])
    pair = policy(2, 5000)
    assert evaluate(pair, [make_offer(usd_per_hour=2.0)], APRIL, committed=spend).candidates
    ranking = evaluate(pair, [make_offer(usd_per_hour=4.0)], APRIL, committed=spend)
    (rejected,) = ranking.rejections
    assert rejected.reason == (
        "projected $5,140.00 this month ($100.00 spent + 1 live (2 instances) at $20/h "
        "+ 2 nodes x $4/h, for 180.0 h) > budget $5,000.00/month"
    )


class Cloud:
    """A provider whose every launch succeeds at once."""

    name = "aws"

    def launch(self, offer: Any, spec: Any, key: str) -> InstanceRef:
        return InstanceRef("aws", offer.region, offer.zone, f"i-{key}")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    store.prices.record_offers([make_offer(usd_per_hour=0.40, observed_at=NOVEMBER)])
    for name in ("a", "b"):  # the job spec's nodes win over the policy's (1)
        store.jobs.add_job(name, "p", {"run": "x", "checkpoint_dir": f"/{name}", "nodes": 2})
    yield store
    store.close()


def test_a_gang_launch_and_a_live_gang_count_every_node_against_the_budget(store: Store) -> None:
    # $15 a month, 12 h left, one pool at $0.40/h. Job a's gang of 2 projects
    # 2 x 0.40 x 12 = $9.60 and launches. Job b's gang would bring the month to
    # spent ($0.0141, below) + a's 2 live instances (0.80 x 12) + b's 2 new ones
    # (0.80 x 12) = $19.21 > $15. (Priced as one instance, b's launch would have projected
    # 0.0141 + 1.20 x 12 = $14.41 and launched.)
    limit = policy(1, 15)
    ctx = ReconcileContext(
        now=NOVEMBER,
        jobs=tuple(store.jobs.list_jobs()),
        policies={"p": SimpleNamespace(policy=limit)},
        store=store,
        providers={"aws": ProviderHandle.given("aws", ProviderConfig(), Cloud())},  # type: ignore[arg-type]
        emitter=Drafter(),
        clock=lambda: NOVEMBER,
    )
    launcher = JobReconciler(lambda: "http://d").launcher
    a, b = store.jobs.get_job("a"), store.jobs.get_job("b")
    assert a is not None and b is not None
    launched, why = launcher.walk(ctx, a, Launch(), limit, Failover())
    assert launched, why
    assert [r.instance_id for r in store.jobs.attempts(a.id)] == ["i-1-1", "i-1-1-n1"]

    offers = store.prices.latest_offers()
    spend = job_budget.committed(store, "p", NOVEMBER, offers)
    assert (spend.live_attempts, spend.live_instances) == (1, 2)
    assert spend.live_usd_per_hour == pytest.approx(0.80)  # each node's row once
    # The ledger bills both nodes' 60 s minimum, each with its 200 GiB gp3 root volume
    # ($0.08 per GiB-month, November's 720 h): 2 x (0.40 + 200 x 0.08 / 720) / 60 = $0.0141.
    assert spend.spent_usd == pytest.approx(2 * (0.40 + 200 * 0.08 / 720) * 60 / 3600)
    replaced = job_budget.committed(store, "p", NOVEMBER, offers, replacing=a.id)
    assert (replaced.live_attempts, replaced.live_usd_per_hour) == (0, 0.0)

    launched, why = launcher.walk(ctx, b, Launch(), limit, Failover())
    assert not launched
    assert why == (
        "budget: $0.01 spent this month under policy p, 1 attempt(s) running on 2 instances; "
        "the cheapest launch of 2 nodes projects $19.21 > $15.00"
    )
    assert store.jobs.attempts(b.id) == []
