"""The ranking engine: each rule rejects with its id and numbers, limits pass, ranking is stable."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.model import Interconnect, Market, Offer, PaymentOption
from policies import regions
from policies.budget import Committed
from policies.engine import RULES, Candidate, EvaluationError, Ranking, Rejection, evaluate
from policies.schema import Policy
from providers import registry
from tests.helpers.engine import T0, offer, policy
from tests.helpers.offers import G6_XLARGE

# An 8 x A100-80GB NVLink node on demand in Frankfurt at $40/h, observed at T0.

# A single L4 on demand in us-east-1 at $0.80/h.
small = partial(offer, **G6_XLARGE, region="us-east-1", zone="use1-az1", usd_per_hour=0.8)


def only_rejection(ranking: Ranking) -> Rejection:
    assert ranking.candidates == ()
    assert len(ranking.rejections) == 1
    return ranking.rejections[0]


def accepted(pol: Policy, *offers: Offer, **kwargs: Any) -> bool:
    ranking = evaluate(pol, offers, T0, **kwargs)
    return len(ranking.candidates) == len(offers)


# --- one test per rule --------------------------------------------------------------------


def test_stale_rejects_a_price_older_than_the_max_age_and_keeps_one_exactly_at_it() -> None:
    pol = policy(max_price_age_hours=6)
    old = offer(observed_at=T0 - timedelta(hours=6, seconds=1))
    rejection = only_rejection(evaluate(pol, [old], T0))
    assert rejection.rule == "stale"
    assert rejection.reason == "observed 2026-04-23T05:59:59Z, 6.0 h ago > max age 6 h"
    assert accepted(pol, offer(observed_at=T0 - timedelta(hours=6)))


def test_stale_rejects_a_price_observed_in_the_future() -> None:
    pol = policy(max_price_age_hours=6)
    ahead = offer(observed_at=T0 + timedelta(minutes=30))
    rejection = only_rejection(evaluate(pol, [ahead], T0))
    assert rejection.rule == "stale"
    assert rejection.reason.startswith("observed in the future: 2026-04-23T12:30:00Z is 0.5 h")
    assert accepted(pol, offer(observed_at=T0 + timedelta(minutes=5)))


def test_without_a_max_age_any_observation_time_is_accepted() -> None:
    pol = policy()
    assert accepted(pol, offer(observed_at=T0 - timedelta(days=400)))
    assert accepted(pol, offer(observed_at=T0 + timedelta(days=1)))


def test_market_rejects_a_market_the_policy_does_not_list() -> None:
    rejection = only_rejection(evaluate(policy(markets=["spot"]), [offer()], T0))
    assert rejection == (offer(), "market", "on_demand not allowed (markets: spot)")
    assert accepted(policy(markets=["spot"]), offer(market=Market.SPOT))


def test_provider_rejects_a_cloud_the_policy_does_not_list() -> None:
    pol = policy(placement={"providers": ["gcp", "local"]})
    rejection = only_rejection(evaluate(pol, [offer()], T0))
    assert (rejection.rule, rejection.reason) == (
        "provider",
        "aws not allowed (providers: gcp, local)",
    )
    assert accepted(pol, offer(provider="gcp", region="europe-west4", zone=None))


def test_region_deny_glob_wins_over_allow() -> None:
    pol = policy(placement={"regions": {"allow": ["eu-*"], "deny": ["eu-central-*"]}})
    rejection = only_rejection(evaluate(pol, [offer()], T0))
    assert (rejection.rule, rejection.reason) == (
        "region",
        "eu-central-1 matches deny glob 'eu-central-*'",
    )
    assert accepted(pol, offer(region="eu-west-1"))


def test_region_must_match_an_allow_glob_case_sensitively() -> None:
    pol = policy(placement={"regions": {"allow": ["eu-west-*", "europe-*"]}})
    rejection = only_rejection(evaluate(pol, [offer()], T0))
    assert (rejection.rule, rejection.reason) == (
        "region",
        "eu-central-1 matches no allow glob (eu-west-*, europe-*)",
    )
    # A glob in capitals matches no region (they are lower case): refused when the policy is
    # read, saying so, rather than rejecting every offer.
    with pytest.raises(
        ValueError,
        match=r"'EU-\*' matches no region gpuopt knows \(globs are "
        r"case-sensitive: eu-\*\?\)",
    ):
        policy(placement={"regions": {"allow": ["EU-*", "europe-*"]}})


def test_gdpr_rejects_london_and_accepts_frankfurt() -> None:
    pol = policy(placement={"compliance": "gdpr"})
    london = offer(region="eu-west-2", zone="euw2-az1")
    rejection = only_rejection(evaluate(pol, [london], T0))
    assert rejection.rule == "compliance"
    assert rejection.reason == "eu-west-2 is in GB (London), outside the EU/EEA"
    assert accepted(pol, offer())  # eu-central-1, Frankfurt


def test_compliance_fails_closed_on_a_region_the_table_does_not_know() -> None:
    pol = policy(placement={"compliance": "eu"})
    rejection = only_rejection(evaluate(pol, [offer(region="eu-moon-1")], T0))
    assert rejection.rule == "compliance"
    assert rejection.reason.startswith("unknown jurisdiction")
    assert accepted(policy(), offer(region="eu-moon-1"))  # no preset: no table needed


def test_countries_limit_regions_to_the_listed_countries() -> None:
    pol = policy(placement={"countries": ["IE"]})
    rejection = only_rejection(evaluate(pol, [offer()], T0))
    assert rejection.rule == "compliance"
    assert "not in the allowed countries (IE)" in rejection.reason
    assert accepted(pol, offer(region="eu-west-1"))


def test_gpu_model_rejects_models_outside_the_list() -> None:
    pol = policy(workload={"gpu_models": ["H100", "A100-80GB"]})
    rejection = only_rejection(evaluate(pol, [small()], T0))
    assert (rejection.rule, rejection.reason) == (
        "gpu_model",
        "L4 is not one of the allowed models (A100-80GB, H100-80GB)",
    )
    assert accepted(pol, offer())


def test_gpu_count_needs_at_least_the_workloads_gpus() -> None:
    pol = policy(workload={"gpus": 8})
    rejection = only_rejection(evaluate(pol, [offer(gpu_count=4)], T0))
    assert (rejection.rule, rejection.reason) == ("gpu_count", "4 GPUs < 8 needed")
    assert accepted(pol, offer(gpu_count=8))


def test_gpu_memory_buffer_makes_a_70_gib_need_reject_an_80_gib_gpu() -> None:
    rejection = only_rejection(evaluate(policy(workload={"gpu_memory_gib": 70}), [offer()], T0))
    assert rejection.rule == "gpu_memory"
    assert rejection.reason == "80.0 GiB per GPU < 84.0 GiB needed (70 + 20% buffer)"
    assert accepted(policy(workload={"gpu_memory_gib": 60}), offer())


def test_gpu_memory_exactly_at_need_plus_buffer_passes() -> None:
    pol = policy(workload={"gpu_memory_gib": 70})
    assert accepted(pol, offer(gpu_memory_gib=84.0))
    assert not accepted(pol, offer(gpu_memory_gib=83.99))
    assert accepted(policy(workload={"gpu_memory_gib": 70}, buffer=0), offer(gpu_memory_gib=70.0))


def test_gpu_memory_need_derived_from_a_model() -> None:
    # 7B bf16 Adam training on 8 GPUs: 16 B/param x 1.2 activations / 8 = 15.6 GiB per GPU.
    pol = policy(workload={"gpus": 8, "model": {"parameters": "7B"}})
    ranking = evaluate(pol, [offer(gpu_memory_gib=16.0), offer()], T0)
    assert ranking.rejections[0].rule == "gpu_memory"
    assert "16.0 GiB per GPU < 18.8 GiB needed (15.6462 + 20% buffer)" in str(ranking.rejections[0])
    assert ranking.best is not None and ranking.best.offer.gpu_memory_gib == 80.0


def test_fp64_rejects_a_gpu_without_fp64_units() -> None:
    pol = policy(workload={"fp64": True})
    rejection = only_rejection(evaluate(pol, [small()], T0))
    assert (rejection.rule, rejection.reason) == (
        "fp64",
        "L4 has no real FP64 units (0.5 TFLOPS FP64 < 5)",
    )
    assert accepted(pol, offer())  # A100: 9.7 TFLOPS FP64


def test_fp64_rejects_an_unknown_gpu() -> None:
    pol = policy(workload={"fp64": True})
    rejection = only_rejection(evaluate(pol, [offer(gpu_model="unknown:Mystery")], T0))
    assert rejection.rule == "fp64"
    assert rejection.reason.startswith("unknown GPU model: no FP64 figure")


def test_nvlink_rejects_a_multi_gpu_node_without_it() -> None:
    pol = policy(workload={"gpus": 8, "interconnect": "nvlink"})
    pcie = offer(interconnect=Interconnect.PCIE)
    rejection = only_rejection(evaluate(pol, [pcie], T0))
    assert (rejection.rule, rejection.reason) == (
        "interconnect",
        "pcie between 8 GPUs; NVLink required",
    )
    assert accepted(pol, offer())


def test_nvlink_for_one_gpu_accepts_a_single_gpu_but_not_an_unlinked_node() -> None:
    pol = policy(workload={"gpus": 1, "interconnect": "nvlink"})
    assert accepted(pol, small())  # one GPU asked, one offered: nothing to link
    four = small(gpu_count=4, interconnect=Interconnect.PCIE)
    assert only_rejection(evaluate(pol, [four], T0)).rule == "interconnect"


def test_throughput_needs_node_tflops_above_min_plus_buffer() -> None:
    # 8 x A100 bf16 312 = 2496 TFLOPS; 2080 x 1.2 = 2496 exactly.
    assert accepted(policy(workload={"min_tflops": {"bf16": 2080}}), offer())
    pol = policy(workload={"min_tflops": {"fp32": 100, "bf16": 2100}})
    rejection = only_rejection(evaluate(pol, [offer()], T0))
    assert (rejection.rule, rejection.reason) == (
        "throughput",
        "bf16: 8 x 312 TFLOPS = 2496 TFLOPS < 2520 needed (2100 + 20% buffer)",
    )


def test_t4_is_rejected_for_bf16_throughput() -> None:
    t4 = small(gpu_model="T4", gpu_memory_gib=16.0)
    rejection = only_rejection(evaluate(policy(workload={"min_tflops": {"bf16": 10}}), [t4], T0))
    assert (rejection.rule, rejection.reason) == ("throughput", "T4 has no bf16 figure")
    assert accepted(policy(workload={"min_tflops": {"fp16": 10}}), t4)


def test_price_per_tflop_rejects_a_gpu_with_no_figure_for_the_ranking_dtype() -> None:
    t4 = small(gpu_model="T4", gpu_memory_gib=16.0)
    pol = policy(rank_by="price_per_tflop")  # dtype bf16 by default
    rejection = only_rejection(evaluate(pol, [t4], T0))
    assert (rejection.rule, rejection.reason) == (
        "throughput",
        "T4 has no bf16 figure to rank by price per TFLOP",
    )


def test_cpu_memory_and_vcpus_are_host_minimums() -> None:
    pol = policy(workload={"cpu_memory_gib": 1152, "vcpus": 96})
    assert accepted(pol, offer())
    rejection = only_rejection(evaluate(pol, [offer(ram_gib=1024.0)], T0))
    assert (rejection.rule, rejection.reason) == (
        "cpu_memory",
        "1024.0 GiB RAM < 1152 GiB needed",
    )
    rejection = only_rejection(evaluate(pol, [offer(vcpus=48)], T0))
    assert (rejection.rule, rejection.reason) == ("vcpus", "48 vCPUs < 96 needed")


def test_max_usd_per_hour_caps_the_whole_instance() -> None:
    pol = policy(bid={"max_usd_per_hour": 40})
    assert accepted(pol, offer(usd_per_hour=40.0))
    rejection = only_rejection(evaluate(pol, [offer(usd_per_hour=41.2)], T0))
    assert (rejection.rule, rejection.reason) == ("bid.max_usd_per_hour", "$41.2/h > cap $40/h")


def test_max_usd_per_gpu_hour_caps_the_price_per_gpu() -> None:
    pol = policy(bid={"max_usd_per_gpu_hour": 5})
    assert accepted(pol, offer(usd_per_hour=40.0))
    rejection = only_rejection(evaluate(pol, [offer(usd_per_hour=44.0)], T0))
    assert (rejection.rule, rejection.reason) == (
        "bid.max_usd_per_gpu_hour",
        "$5.5/GPU-h ($44/h over 8 GPUs) > cap $5/GPU-h",
    )


def test_fraction_of_on_demand_compares_with_the_cheapest_on_demand_zone() -> None:
    pol = policy(markets=["spot"], bid={"max_fraction_of_on_demand": 0.6})
    on_demand = [offer(usd_per_hour=40.0), offer(zone="euc1-az2", usd_per_hour=30.0)]
    at_limit = offer(market=Market.SPOT, usd_per_hour=18.0)  # 0.6 x 30
    over = offer(market=Market.SPOT, zone="euc1-az3", usd_per_hour=18.3)
    ranking = evaluate(pol, [*on_demand, at_limit, over], T0)
    assert [c.offer for c in ranking.candidates] == [at_limit]
    assert ranking.candidates[0].on_demand_usd_per_hour == 30.0
    by_rule = ranking.rejections_by_rule()
    assert list(by_rule) == ["market", "bid.max_fraction_of_on_demand"]
    assert by_rule["bid.max_fraction_of_on_demand"][0].reason == (
        "spot $18.3/h is 0.610 of on-demand $30/h > 0.6"
    )


def test_fraction_of_on_demand_rejects_spot_without_a_reference() -> None:
    pol = policy(bid={"max_fraction_of_on_demand": 0.6})
    spot = offer(market=Market.SPOT, usd_per_hour=1.0)
    other_region = offer(region="eu-west-1", usd_per_hour=40.0)  # not a reference for Frankfurt
    ranking = evaluate(pol, [spot, other_region], T0)
    assert [c.offer for c in ranking.candidates] == [other_region]
    assert ranking.rejections == (
        (spot, "bid.max_fraction_of_on_demand", _no_reference("p4de.24xlarge", "eu-central-1")),
    )


def _no_reference(instance_type: str, region: str) -> str:
    return f"no on-demand price for {instance_type} in {region} to compare"


def test_fraction_of_on_demand_ignores_a_stale_on_demand_price() -> None:
    pol = policy(max_price_age_hours=1, bid={"max_fraction_of_on_demand": 0.6})
    old = offer(observed_at=T0 - timedelta(hours=2))
    spot = offer(market=Market.SPOT, usd_per_hour=1.0)
    ranking = evaluate(pol, [old, spot], T0)
    assert [r.rule for r in ranking.rejections] == ["stale", "bid.max_fraction_of_on_demand"]


def test_budget_projects_the_launch_to_the_end_of_the_month() -> None:
    pol = policy(budget={"monthly_usd": 5000})
    # T0 is 2026-04-23 12:00 UTC: 180 h to the end of April
    assert accepted(pol, offer(usd_per_hour=5000 / 180))
    rejection = only_rejection(evaluate(pol, [offer(usd_per_hour=28.0)], T0))
    assert (rejection.rule, rejection.reason) == (
        "budget",
        "projected $5,040.00 this month ($0.00 spent + $28/h, for 180.0 h) "
        "> budget $5,000.00/month",
    )
    # hours_per_month caps how long an attempt is projected to run this month
    capped = policy(budget={"monthly_usd": 5000, "hours_per_month": 100})
    assert accepted(capped, offer(usd_per_hour=28.0))


def test_budget_counts_what_is_spent_and_every_live_attempt() -> None:
    pol = policy(budget={"monthly_usd": 5000})
    spend = Committed(spent_usd=1000.0, live_usd_per_hour=10.0, live_attempts=1)
    # 1000 + (10 + 12) x 180 = 4960 fits; 1000 + (10 + 13) x 180 = 5140 does not
    assert accepted(pol, offer(usd_per_hour=12.0), committed=spend)
    assert not accepted(pol, offer(usd_per_hour=12.0), committed=replace(spend, spent_usd=1100))
    rejection = only_rejection(evaluate(pol, [offer(usd_per_hour=13.0)], T0, committed=spend))
    assert rejection.reason == (
        "projected $5,140.00 this month ($1,000.00 spent + 1 live at $10/h + $13/h, "
        "for 180.0 h) > budget $5,000.00/month"
    )


# --- order, ranking, figures --------------------------------------------------------------


def test_the_first_failing_rule_wins() -> None:
    pol = policy(
        markets=["spot"],
        workload={"gpus": 16, "gpu_memory_gib": 200},
        bid={"max_usd_per_hour": 1},
    )
    rejection = only_rejection(evaluate(pol, [offer()], T0))
    assert rejection.rule == "market"
    pol = policy(workload={"gpus": 16, "gpu_memory_gib": 200}, bid={"max_usd_per_hour": 1})
    assert only_rejection(evaluate(pol, [offer()], T0)).rule == "gpu_count"


def test_rules_are_listed_in_checking_order() -> None:
    assert RULES[:3] == ("stale", "market", "provider")
    assert RULES[-1] == "budget"
    assert len(set(RULES)) == len(RULES) == 20


def test_price_per_tflop_prefers_a_faster_node_when_its_tflops_are_cheaper() -> None:
    a100 = offer(instance_type="a100-node", usd_per_hour=20.0)  # 2496 TFLOPS: $0.0080
    h100 = offer(
        instance_type="h100-node", gpu_model="H100-80GB", usd_per_hour=40.0
    )  # 8 x 989 = 7912 TFLOPS: $0.0051
    by_price = evaluate(policy(), [h100, a100], T0)
    by_tflop = evaluate(policy(rank_by="price_per_tflop"), [a100, h100], T0)
    assert [c.offer for c in by_price.candidates] == [a100, h100]
    assert [c.offer for c in by_tflop.candidates] == [h100, a100]
    best = by_tflop.candidates[0]
    assert best.node_tflops == 7912
    assert best.score == best.usd_per_tflop_hour == pytest.approx(40 / 7912)


def test_measured_figures_replace_the_table() -> None:
    pol = policy(workload={"min_tflops": {"bf16": 2000}}, rank_by="price_per_tflop")
    assert accepted(pol, offer())  # table: 8 x 312 = 2496 >= 2400
    measured = {"A100-80GB": {"bf16": 250.0}}  # 8 x 250 = 2000 < 2400
    rejection = only_rejection(evaluate(pol, [offer()], T0, measured=measured))
    assert rejection.reason == (
        "bf16: 8 x 250 TFLOPS (measured) = 2000 TFLOPS < 2400 needed (2000 + 20% buffer)"
    )
    faster = evaluate(pol, [offer()], T0, measured={"a100-80gb": {"bf16": 320.0}})
    assert faster.candidates[0].node_tflops == 2560
    assert faster.candidates[0].score == pytest.approx(40 / 2560)


def test_measured_figures_must_be_sane() -> None:
    with pytest.raises(EvaluationError, match="unknown dtype"):
        evaluate(policy(), [offer()], T0, measured={"A100-80GB": {"bf17": 1.0}})
    with pytest.raises(EvaluationError, match="not >= 0"):
        evaluate(policy(), [offer()], T0, measured={"A100-80GB": {"bf16": -1.0}})


def test_now_must_be_timezone_aware() -> None:
    with pytest.raises(EvaluationError, match="timezone-aware"):
        evaluate(policy(), [offer()], datetime(2026, 4, 23))


def test_ties_break_by_market_preference_provider_region_zone_type() -> None:
    pol = policy(markets=["on_demand", "spot"])
    rows = [
        offer(market=Market.SPOT),
        offer(provider="gcp", region="europe-west4", zone=None),
        offer(region="eu-west-1", zone="euw1-az1"),
        offer(zone="euc1-az2", instance_type="b"),
        offer(zone="euc1-az2", instance_type="a"),
        offer(zone=None),
    ]
    expected = [rows[5], rows[4], rows[3], rows[2], rows[1], rows[0]]
    for seed in range(5):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        ranking = evaluate(pol, shuffled, T0)
        assert [c.offer for c in ranking.candidates] == expected
        assert [c.rank for c in ranking.candidates] == [1, 2, 3, 4, 5, 6]


def test_offers_tied_on_every_tiebreak_field_still_sort_one_way() -> None:
    rows = [offer(source="b"), offer(source="a"), offer(ram_gib=2048.0), offer(placement_score=3.0)]
    orders = set()
    for seed in range(8):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        orders.add(tuple(c.offer for c in evaluate(policy(), shuffled, T0).candidates))
    assert len(orders) == 1


def test_candidate_carries_its_score_inputs() -> None:
    spot = offer(market=Market.SPOT, usd_per_hour=16.0)
    ranking = evaluate(policy(workload={"gpu_memory_gib": 50}), [offer(), spot], T0)
    best = ranking.best
    assert best is not None and best.offer == spot
    assert best.rank == 1
    assert best.score == 16.0
    assert best.usd_per_gpu_hour == 2.0
    assert best.gpu_memory_need_gib == 60.0
    assert best.memory_headroom == pytest.approx(80 / 60 - 1)
    assert best.node_tflops == 2496  # bf16, the default dtype
    assert best.usd_per_tflop_hour == pytest.approx(16 / 2496)
    assert best.on_demand_usd_per_hour == 40.0
    assert ranking.dtype == "bf16"
    assert evaluate(policy(), [spot], T0).best.memory_headroom is None  # type: ignore[union-attr]


def test_ranking_groups_rejections_by_rule_and_serializes_to_json() -> None:
    pol = policy(markets=["spot"], workload={"gpus": 8})
    rows = [offer(gpu_count=4, market=Market.SPOT), offer(), offer(market=Market.SPOT)]
    ranking = evaluate(pol, rows, T0)
    assert list(ranking.rejections_by_rule()) == ["market", "gpu_count"]
    data = json.loads(json.dumps(ranking.to_dict()))
    assert data["policy"] == "test"
    assert data["evaluated_at"] == "2026-04-23T12:00:00Z"
    assert data["rejected_by_rule"] == {"market": 1, "gpu_count": 1}
    assert data["candidates"][0]["offer"]["market"] == "spot"
    assert data["rejections"][0] == {
        "rule": "market",
        "reason": "on_demand not allowed (markets: spot)",
        "offer": rows[1].to_dict(),
    }
    assert str(ranking.rejections[1]) == "gpu_count: 4 GPUs < 8 needed"


# --- properties ---------------------------------------------------------------------------

POLICIES = [
    policy(),
    policy(rank_by="price_per_tflop", markets=["spot", "on_demand"]),
    policy(markets=["committed", "spot"]),
    policy(
        max_price_age_hours=3,
        markets=["spot"],
        workload={"gpus": 2, "gpu_memory_gib": 20, "min_tflops": {"fp16": 100}},
        bid={"max_fraction_of_on_demand": 0.5, "max_usd_per_gpu_hour": 4},
        placement={"compliance": "eu", "regions": {"allow": ["eu-*", "europe-*"]}},
        budget={"monthly_usd": 3000},
    ),
    policy(
        workload={"fp64": True, "interconnect": "nvlink", "gpu_models": ["A100-80GB", "T4"]},
        placement={"providers": ["aws"], "regions": {"deny": ["us-*"]}},
        rank_by="price_per_tflop",
    ),
]

_offer_fields = dict(
    provider=st.sampled_from(sorted(registry.names())),  # every installed provider
    region=st.sampled_from(["eu-central-1", "eu-west-2", "us-east-1", "europe-west4", "mars-1"]),
    zone=st.sampled_from([None, "a", "b"]),
    instance_type=st.sampled_from(["t1", "t2"]),
    gpu_model=st.sampled_from(["A100-80GB", "H100-80GB", "T4", "L4", "unknown:X"]),
    gpu_count=st.integers(0, 8),
    gpu_memory_gib=st.sampled_from([16.0, 24.0, 80.0]),
    vcpus=st.sampled_from([4, 96]),
    ram_gib=st.sampled_from([16.0, 1152.0]),
    interconnect=st.sampled_from(list(Interconnect)),
    usd_per_hour=st.sampled_from([0.0, 0.5, 1.0, 4.0, 10.0, 40.0]),
    observed_at=st.sampled_from([T0, T0 - timedelta(hours=5), T0 + timedelta(hours=1)]),
)
offers_strategy = st.one_of(
    st.builds(Offer, market=st.sampled_from([Market.SPOT, Market.ON_DEMAND]), **_offer_fields),
    # a commitment carries its term and payment option (no upfront: any price is valid)
    st.builds(
        Offer,
        market=st.just(Market.COMMITTED),
        term_years=st.sampled_from([1, 3]),
        payment_option=st.sampled_from(list(PaymentOption)),
        upfront_usd=st.just(0.0),
        **_offer_fields,
    ),
)


def _order_key(pol: Policy, c: Candidate) -> tuple[Any, ...]:
    o = c.offer
    return (
        c.score,
        pol.markets.index(o.market.value),
        o.provider,
        o.region,
        o.zone or "",
        o.instance_type,
    )


@settings(max_examples=200, deadline=None)
@given(
    pol=st.sampled_from(POLICIES),
    rows=st.lists(offers_strategy, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_every_offer_lands_once_sorted_and_order_free(
    pol: Policy, rows: list[Offer], seed: int
) -> None:
    ranking = evaluate(pol, rows, T0)
    out = [c.offer for c in ranking.candidates] + [r.offer for r in ranking.rejections]
    assert Counter(map(id, out)) == Counter(map(id, rows))
    assert all(r.rule in RULES for r in ranking.rejections)
    by_rule = ranking.rejections_by_rule()
    assert ranking.rejection_counts() == {rule: len(found) for rule, found in by_rule.items()}
    assert [rule for rule in RULES if rule in by_rule] == list(by_rule)  # checking order
    assert all(list(ranking.rejected(rule)) == found for rule, found in by_rule.items())
    keys = [_order_key(pol, c) for c in ranking.candidates]
    assert keys == sorted(keys)
    assert [c.rank for c in ranking.candidates] == list(range(1, len(keys) + 1))

    shuffled = rows[:]
    random.Random(seed).shuffle(shuffled)
    again = evaluate(pol, shuffled, T0)
    assert again.candidates == ranking.candidates
    assert Counter(again.rejections) == Counter(ranking.rejections)


# --- the collector and the records --------------------------------------------------------


def test_evaluate_leaves_the_garbage_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    def refuse(*_: object) -> None:
        raise AssertionError("evaluate changed the process-wide garbage collector")

    for switch in ("disable", "enable", "freeze", "unfreeze", "set_threshold", "collect"):
        monkeypatch.setattr(gc, switch, refuse)
    rows = [small(), offer(), small(observed_at=T0 - timedelta(days=2)), small(market=Market.SPOT)]
    ranking = evaluate(policy(workload={"gpus": 8}), rows, T0)
    assert [c.offer for c in ranking.candidates] == [rows[1]]
    assert gc.isenabled()


def test_rejection_records_are_built_when_read_and_read_once() -> None:
    rows = [small(), offer(), small(observed_at=T0 - timedelta(days=2)), small(zone="use1-az2")]
    ranking = evaluate(policy(workload={"gpus": 8}, max_price_age_hours=6), rows, T0)
    assert ranking.rejection_counts() == {"stale": 1, "gpu_count": 2}
    assert ranking.rejected("gpu_count") == (
        Rejection(rows[0], "gpu_count", "1 GPUs < 8 needed"),
        Rejection(rows[3], "gpu_count", "1 GPUs < 8 needed"),
    )
    assert ranking.rejected("budget") == ()
    assert [r.rule for r in ranking.rejections] == ["stale", "gpu_count", "gpu_count"]
    assert ranking.rejections is ranking.rejections  # built once
    assert ranking.rejected("gpu_count")[0] is ranking.rejections[1]
    later = evaluate(policy(workload={"gpus": 8}, max_price_age_hours=6), rows, T0)
    assert later.rejections[1] is later.rejected("gpu_count")[0]  # the other way round
    again = evaluate(policy(workload={"gpus": 8}, max_price_age_hours=6), rows, T0)
    assert again == ranking and hash(again) == hash(ranking)


# --- real rows ----------------------------------------------------------------------------


@pytest.mark.catalog
def test_eu_gdpr_eight_gpu_nvlink_training_on_the_real_catalog(shared_catalog_dir) -> None:
    from providers.skypilot_catalog import read_directory

    rows = read_directory(shared_catalog_dir, T0)
    pol = policy(
        name="llm-training-eu",
        workload={"gpus": 8, "gpu_memory_gib": 66, "interconnect": "nvlink"},
        placement={"compliance": "gdpr"},
    )
    ranking = evaluate(pol, rows, T0)
    assert len(ranking.candidates) + len(ranking.rejections) == len(rows)
    best = ranking.best
    assert best is not None
    found = regions.lookup(best.offer.provider, best.offer.region)
    assert found is not None and found.eea
    assert best.offer.interconnect is Interconnect.NVLINK
    assert best.offer.gpu_count >= 8
    assert best.offer.gpu_memory_gib >= 80 * 0.99
    for candidate in ranking.candidates:
        where = regions.lookup(candidate.offer.provider, candidate.offer.region)
        assert where is not None and where.eea
    assert {"compliance", "gpu_count", "gpu_memory"} <= set(ranking.rejections_by_rule())
