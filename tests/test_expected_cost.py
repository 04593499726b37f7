"""Ranking by expected cost: price x (1 + p x overhead hours), with hand-computed numbers."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from optimizer.jobs.expected import histories_of, notice_to_running, overhead_of
from optimizer.jobs.ranking import launch_ranking
from optimizer.model import Market
from optimizer.store import Store
from policies import risk
from policies.engine import evaluate
from policies.schema import Policy
from tests.helpers.offers import T0, make_offer

NOW = T0 + timedelta(days=2)
A = make_offer(zone="use1-az1", usd_per_hour=1.00, observed_at=NOW)  # spot, will be busy
B = make_offer(zone="use1-az2", usd_per_hour=1.20, observed_at=NOW)  # spot, quiet
OD = make_offer(zone=None, market=Market.ON_DEMAND, usd_per_hour=1.25, observed_at=NOW)


def policy(rank_by: str = "expected_cost") -> Policy:
    return Policy.model_validate(
        {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "team", "rank_by": rank_by}
    )


# -- the model, by hand ------------------------------------------------------------------------


def test_expected_cost_is_price_grown_by_p_times_the_overhead() -> None:
    assert risk.expected_usd_per_hour(2.00, 0.05, 0.5) == pytest.approx(2.05)
    assert risk.expected_usd_per_hour(3.00, 0.0, 4.0) == 3.00


def test_p_is_the_prior_updated_with_the_pools_history() -> None:
    # (0.01 x 10 + 2) / (10 + 4) = 2.1 / 14 = 0.15
    busy = risk.interruption_risk(A, risk.PoolHistory(hours=4.0, interruptions=2))
    assert busy.p == pytest.approx(0.15)
    assert busy.source == "history (2 in 4.0 h) + prior (default)"
    # (0.01 x 10 + 0) / (10 + 40) = 0.002
    quiet = risk.interruption_risk(B, risk.PoolHistory(hours=40.0))
    assert quiet.p == pytest.approx(0.002)
    assert risk.interruption_risk(B, None) == risk.Risk(0.01, "prior (default)")
    assert risk.interruption_risk(OD, risk.PoolHistory(5.0, 3)) == risk.Risk(0.0, "on-demand")


def test_the_advisor_bucket_and_placement_score_set_the_prior() -> None:
    assert risk.advisor_fraction("<5%") == 0.025
    assert risk.advisor_fraction("5-10%") == pytest.approx(0.075)
    assert risk.advisor_fraction(">20%") == 0.20
    assert risk.advisor_fraction("often") is None
    # <5%: 2.5% a month, -ln(0.975) / 730 per hour = 3.4682e-5
    advised = make_offer(interruption_bucket="<5%")
    assert risk.prior(advised).p == pytest.approx(-math.log(0.975) / 730)
    assert risk.prior(advised).p == pytest.approx(3.4682e-5, rel=1e-4)
    # a placement score of 10 scales by (11 - 10) / 5.5; of 1 by 10 / 5.5
    scored = make_offer(placement_score=10.0)
    assert risk.prior(scored) == risk.Risk(pytest.approx(0.01 / 5.5), "default, placement score 10")  # type: ignore[arg-type]
    assert risk.prior(make_offer(placement_score=1.0)).p == pytest.approx(0.01 * 10 / 5.5)


def test_the_overhead_comes_from_the_ledger_then_observed_restarts_then_the_default() -> None:
    assert risk.restart_overhead([0.2, 0.4], [1.0]) == risk.Overhead(
        pytest.approx(0.3),  # type: ignore[arg-type]
        "cost ledger (mean of 2 relaunches)",
    )
    assert risk.restart_overhead([], [0.5, 1.5]) == risk.Overhead(
        1.0, "notice to running (mean of 2)"
    )
    assert risk.restart_overhead([], []) == risk.Overhead(0.25, "default")


def test_a_recently_interrupted_pool_ranks_after_a_dearer_quiet_one_with_a_reason() -> None:
    ranking = evaluate(policy(), [A, B, OD], NOW)
    assert [c.offer for c in ranking.candidates] == [A, B, OD]  # the engine: by price
    histories = {
        ("aws", "us-east-1", "use1-az1", "g5.xlarge", "spot"): risk.PoolHistory(
            4.0, 2, NOW - timedelta(hours=1)
        ),
        ("aws", "us-east-1", "use1-az2", "g5.xlarge", "spot"): risk.PoolHistory(40.0, 0, None),
    }
    overhead = risk.Overhead(2.0, "notice to running (mean of 1)")
    ranked = risk.by_expected_cost(risk.annotate_all(ranking.candidates, histories, overhead, NOW))
    # A: 1.00 x (1 + 0.15 x 2) = 1.30; B: 1.20 x (1 + 0.002 x 2) = 1.2048; OD: 1.25
    assert [(c.offer, c.rank) for c in ranked] == [(B, 1), (OD, 2), (A, 3)]
    assert [c.expected_usd_per_hour for c in ranked] == pytest.approx([1.2048, 1.25, 1.30])
    assert [c.score for c in ranked] == pytest.approx([1.2048, 1.25, 1.30])
    assert ranked[2].risk == "interrupted 2 time(s) in the last 30 days, last 1.0 h ago"
    assert ranked[0].risk is None and ranked[2].overhead_hours == 2.0
    assert ranked[2].to_dict()["interruption_source"] == "history (2 in 4.0 h) + prior (default)"


# -- from the store ----------------------------------------------------------------------------


def _attempt(store: Store, job: str, number: int, offer, start, end=None, notice=None, ran=None):
    found = store.jobs.get_job(job)
    job_id = found.id if found else store.jobs.add_job(job, "team", {"run": "x"}, at=T0)
    key = f"{job}-{number}"
    store.jobs.create_attempt(job_id, number, key, offer, "sha", start)
    values = {"instance_id": f"i-{key}", "launched_at": start}
    if end is not None:
        values |= {
            "ended_at": end,
            "state": "ended",
            "end_reason": "preempted" if notice else "exit",
        }
    if notice is not None:
        values["notice_at"] = notice
    if ran is not None:
        values["job_started_at"] = ran
    store.jobs.update_attempt(key, **values)
    return job_id


def test_launch_ranking_by_expected_cost_reads_the_pools_history_and_restart_times(
    store: Store,
) -> None:
    store.prices.record_offers([A, B, OD])
    # Job one: 2 h on A, interrupted; relaunched on A 30 min after the notice (running at
    # +2.5 h), interrupted again at +4 h; then on B from +4.5 h to now.
    t = NOW - timedelta(hours=10)
    h = timedelta(hours=1)
    _attempt(store, "one", 1, A, t, end=t + 2 * h, notice=t + 2 * h, ran=t)
    _attempt(store, "one", 2, A, t + 2 * h, end=t + 4 * h, notice=t + 4 * h, ran=t + 2.5 * h)
    _attempt(store, "one", 3, B, t + 4 * h, ran=t + 4.5 * h)
    histories = histories_of(store.jobs.attempts_since(NOW - risk.HISTORY), NOW - risk.HISTORY, NOW)
    a_pool = ("aws", "us-east-1", "use1-az1", "g5.xlarge", "spot")
    assert histories[a_pool] == risk.PoolHistory(4.0, 2, t + 4 * h)
    assert notice_to_running(store.jobs.policy_attempts("team", NOW - risk.HISTORY)) == [0.5, 0.5]
    assert overhead_of(store, "team", NOW) == risk.Overhead(0.5, "notice to running (mean of 2)")

    found = launch_ranking(store, "team", policy(), NOW).ranking
    got = [(c.offer.zone, c.offer.market.value) for c in found.candidates]
    # A: p = 2.1 / 14 = 0.15, 1.00 x (1 + 0.15 x 0.5) = 1.075
    # B: p = (0.1 + 0) / (10 + 6) = 0.00625, 1.20 x (1 + 0.00625 x 0.5) = 1.20375
    assert got == [("use1-az1", "spot"), ("use1-az2", "spot"), (None, "on_demand")]
    assert [c.expected_usd_per_hour for c in found.candidates] == pytest.approx(
        [1.075, 1.20375, 1.25]
    )
    assert found.candidates[0].risk == "interrupted 2 time(s) in the last 30 days, last 6.0 h ago"
    # ranked by price, the same candidates carry no expected cost from the launch ranking
    plain = launch_ranking(store, "team", policy("price"), NOW).ranking
    assert plain.candidates[0].expected_usd_per_hour is None
