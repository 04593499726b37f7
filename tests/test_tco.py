"""The TCO model (optimizer/costs/tco.py) against totals worked out by hand (docs/tco.md).

One fixed case: 8x H100-80GB, 500 h/month, 3 years; on-demand $40/h, spot $16/h, a 1-year
no-upfront commitment at $28/h and a 3-year all-upfront one at $18/h effective; on-premises
one $200,000 server, PUE 1.5, $0.10/kWh, operations 10% of capex a year.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from optimizer.costs.tco import (
    HOURS_PER_MONTH,
    Kind,
    TcoError,
    Usage,
    affordable_hours,
    break_even,
)
from optimizer.costs.tco_assumptions import Assumptions
from optimizer.costs.tco_plan import plan, plan_within_budget
from optimizer.model import Interconnect, Market, Offer, PaymentOption

AT = datetime(2026, 11, 1, tzinfo=UTC)
USAGE = Usage("H100-80GB", 8, 500, 3)
ASSUME = Assumptions.model_validate(
    {
        "spot": {"overhead_fraction": 0.10, "on_demand_share": 0.20},
        "on_prem": {
            "server_usd": 200_000,
            "host_power_w": 4600,
            "idle_power_fraction": 0.30,
            "pue": 1.5,
            "usd_per_kwh": 0.10,
            "ops_fraction_per_year": 0.10,
        },
    }
)


def offer(market: Market, usd: float, **terms: object) -> Offer:
    return Offer(
        "aws",
        "us-east-1",
        None,
        "p5.48xlarge",
        "H100-80GB",
        8,
        80.0,
        192,
        2048.0,
        Interconnect.NVLINK,
        market,
        usd,
        AT,
        source="test",
        **terms,  # type: ignore[arg-type]
    )


OFFERS = [
    offer(Market.ON_DEMAND, 40.0),
    offer(Market.SPOT, 16.0),
    offer(Market.COMMITTED, 28.0, term_years=1, payment_option=PaymentOption.NO_UPFRONT),
    # all upfront: 18 $/h x 26,280 h paid at the start, no hourly fee
    offer(
        Market.COMMITTED,
        18.0,
        term_years=3,
        payment_option=PaymentOption.ALL_UPFRONT,
        upfront_usd=473_040.0,
    ),
]


def by_name(usage: Usage = USAGE, offers: list[Offer] = OFFERS) -> dict[str, object]:
    result = plan(usage, offers, ASSUME, tdp_w=700)
    return {o.name: o for o in result.options}


def test_on_demand_pays_the_hours_used():
    od = by_name()["on-demand"]
    assert od.total(500) == pytest.approx(40 * 500 * 36)  # 720,000


def test_spot_adds_its_overhead_and_the_on_demand_fallback():
    s = by_name()["spot"]
    # 0.8 x 16 + 0.8 x 16 x 0.10 + 0.2 x 40 = 22.08 $/h of use
    assert s.total(500) == pytest.approx(22.08 * 500 * 36)  # 397,440
    assert s.parts["overhead"] == pytest.approx(1.28 * 500 * 36)
    assert s.parts["on_demand_fallback"] == pytest.approx(8.0 * 500 * 36)


def test_commitment_is_paid_for_every_hour_of_its_terms_used_or_not():
    options = by_name()
    one = options["committed 1y no upfront"]
    three = options["committed 3y all upfront"]
    assert one.total(500) == pytest.approx(28 * 8760 * 3)  # 3 yearly terms: 735,840
    assert one.total(0) == one.total(730)  # usage does not change it
    # paid for 26,280 h, used 18,000: 8,280 unused hours at $28
    assert one.parts["unused_hours"] == pytest.approx(28 * 8280)  # 231,840
    assert three.total(500) == pytest.approx(473_040)
    assert three.parts["upfront"] == pytest.approx(473_040)
    assert three.parts["unused_hours"] == pytest.approx(18 * 8280)  # 149,040
    # all upfront: the whole term is spent before the first hour
    assert three.cumulative_usd[0] == pytest.approx(473_040)
    assert one.cumulative_usd[12] == pytest.approx(28 * 8760)


def test_a_term_that_outlasts_the_horizon_is_paid_in_full():
    two_years = Usage("H100-80GB", 8, 500, 2)
    three = by_name(two_years)["committed 3y all upfront"]
    assert three.total(500) == pytest.approx(473_040)
    assert any("outlasts" in n for n in three.notes)


def test_on_premises_counts_capex_operations_and_busy_and_idle_power():
    op = by_name()["on-premises"]
    # 10.2 kW busy (8 x 700 W + 4,600 W), 3.06 kW idle; x PUE 1.5 x $0.10 = 1.53 / 0.459 $/h
    assert op.parts["depreciation"] == pytest.approx(200_000)
    assert op.parts["operations"] == pytest.approx(60_000)
    assert op.parts["power_busy"] == pytest.approx(1.53 * 500 * 36)  # 27,540
    assert op.parts["power_idle"] == pytest.approx(0.459 * 230 * 36)  # 3,800.52
    assert op.total(500) == pytest.approx(291_340.52)
    assert op.cumulative_usd[-1] == pytest.approx(291_340.52)


def test_resale_and_depreciation_longer_than_the_horizon():
    longer = ASSUME.model_copy(
        update={"on_prem": ASSUME.on_prem.model_copy(update={"depreciation_years": 6.0})}
    )
    op = {o.name: o for o in plan(USAGE, OFFERS, longer, tdp_w=700).options}["on-premises"]
    assert op.parts["depreciation"] == pytest.approx(100_000)  # 3 of 6 years written off
    resold = ASSUME.model_copy(
        update={"on_prem": ASSUME.on_prem.model_copy(update={"resale_fraction": 0.25})}
    )
    op = {o.name: o for o in plan(USAGE, OFFERS, resold, tdp_w=700).options}["on-premises"]
    assert op.parts["resale"] == pytest.approx(-50_000)
    assert op.total(500) == pytest.approx(291_340.52 - 50_000)


def test_mix_takes_the_cheaper_side_at_the_stated_usage():
    options = by_name()
    assert options["spot + committed"].total(500) == pytest.approx(397_440)  # all spot
    busy = Usage("H100-80GB", 8, 700, 3)
    heavy = by_name(busy)
    # at 700 h spot costs 22.08 x 700 x 36 = 556,416 > the 3-year commitment's 473,040
    assert heavy["spot + committed"].total(700) == pytest.approx(473_040)
    assert "all on committed 3y" in heavy["spot + committed"].where


def test_break_evens_worked_by_hand():
    options = by_name()
    od, s = options["on-demand"], options["spot"]
    one, three = options["committed 1y no upfront"], options["committed 3y all upfront"]
    op = options["on-premises"]
    assert break_even(od, one).hours_per_month == pytest.approx(735_840 / 1440)  # 511 h
    assert break_even(od, three).hours_per_month == pytest.approx(473_040 / 1440)  # 328.5 h
    assert break_even(s, three).hours_per_month == pytest.approx(473_040 / 794.88)  # 595.1 h
    # on-prem: fixed 272,062.52 (capex, ops, idle power all month), 38.556 $ per h/month
    assert break_even(od, op).hours_per_month == pytest.approx(272_062.52 / (1440 - 38.556))
    cross = break_even(s, op)
    assert cross.hours_per_month == pytest.approx(272_062.52 / (794.88 - 38.556))  # 359.7 h
    assert (cross.below, cross.above) == ("spot", "on-premises")
    never = break_even(od, s)
    assert never.hours_per_month is None and never.cheaper == "spot"
    assert break_even(one, three).cheaper == "committed 3y all upfront"


def test_cheapest_at_the_stated_usage_and_the_reason():
    result = plan(USAGE, OFFERS, ASSUME, tdp_w=700)
    assert result.cheapest.kind is Kind.ON_PREM
    assert "on-premises is cheapest at 500 h/month" in result.recommendation
    assert "$106,099 less than spot" in result.recommendation  # 397,440 - 291,340.52
    assert "spot would win below 360 h/month" in result.recommendation


def test_estimates_fill_in_what_is_not_offered():
    result = plan(USAGE, OFFERS[:1], ASSUME, tdp_w=700)
    options = {o.name: o for o in result.options}
    # spot: 60% under $40 = $16; same totals as the offered spot price
    assert options["spot"].total(500) == pytest.approx(397_440)
    assert any("estimated" in n for n in options["spot"].notes)
    # 1 year: 30.6% under $40 = $27.76/h for every hour of 3 yearly terms
    one = options["committed 1y no upfront"]
    assert one.total(0) == pytest.approx(27.76 * 8760 * 3)
    three = options["committed 3y no upfront"]
    assert three.total(0) == pytest.approx(40 * (1 - 0.561) * 8760 * 3)


def test_on_premises_left_out_without_a_server_price():
    a100 = Usage("A100-80GB", 8, 500, 3)
    rows = [
        Offer(
            "gcp",
            "us-central1",
            None,
            "a2-ultragpu-8g",
            "A100-80GB",
            8,
            80.0,
            96,
            1360.0,
            Interconnect.NVLINK,
            Market.ON_DEMAND,
            23.56656,
            AT,
        )
    ]
    result = plan(a100, rows, Assumptions(), tdp_w=400)
    assert Kind.ON_PREM not in {o.kind for o in result.options}
    assert any("on_prem.server_usd" in n for n in result.notes)


def test_capacity_is_whole_instances():
    one_gpu = [
        Offer(
            "aws",
            "us-east-1",
            None,
            "p5.4xlarge",
            "H100-80GB",
            1,
            80.0,
            16,
            256.0,
            Interconnect.NONE,
            Market.ON_DEMAND,
            6.0,
            AT,
        )
    ]
    result = plan(Usage("H100-80GB", 3, 100, 1), one_gpu, ASSUME, tdp_w=700)
    od = {o.name: o for o in result.options}["on-demand"]
    assert od.total(100) == pytest.approx(3 * 6.0 * 100 * 12)
    assert od.where.startswith("3x p5.4xlarge")


def test_budget_buys_hours_per_option():
    options = by_name()
    assert affordable_hours(options["on-demand"], 10_000, USAGE) == pytest.approx(250)
    assert affordable_hours(options["committed 1y no upfront"], 10_000, USAGE) == 0
    assert affordable_hours(options["committed 3y all upfront"], 20_000, USAGE) == HOURS_PER_MONTH


def test_bad_usage_is_refused():
    with pytest.raises(TcoError, match="hours per month"):
        Usage("H100-80GB", 8, 731, 3)
    with pytest.raises(TcoError, match="gpus"):
        Usage("H100-80GB", 0, 100, 3)


def test_the_guides_budget_example():
    """$5k/month, 8 GPUs, spot for 80% of the training hours (on-demand for the rest).

    8x A100-80GB at the bundled snapshot's cheapest on-demand price (GCP a2-ultragpu-8g,
    us-central1, $23.56656/h), spot estimated 60% under it, the default 10% overhead:
    spot costs 0.8 x 9.426624 x 1.1 + 0.2 x 23.56656 = $13.00874112 per hour of use, so
    $5,000 buys 384.35 h a month on spot against 212.2 h on demand; a 1-year commitment
    costs 23.56656 x 0.694 x 730 = $11,939 a month and a 3-year one $7,552, whatever the
    usage: neither fits. gpuopt recommends spot.
    """
    rows = [
        Offer(
            "gcp",
            "us-central1",
            None,
            "a2-ultragpu-8g",
            "A100-80GB",
            8,
            80.0,
            96,
            1360.0,
            Interconnect.NVLINK,
            Market.ON_DEMAND,
            23.56656,
            AT,
        )
    ]
    a = Assumptions.model_validate({"spot": {"on_demand_share": 0.2}})
    result = plan_within_budget(
        Usage("A100-80GB", 8, 0, 3), rows, a, tdp_w=400, budget_usd_per_month=5000
    )
    assert result.cheapest.kind is Kind.SPOT
    assert result.usage.hours_per_month == pytest.approx(5000 / 13.00874112, abs=0.01)
    hours = result.to_dict()["affordable_hours_per_month"]
    assert hours["on-demand"] == pytest.approx(5000 / 23.56656, abs=0.01)  # 212.2 h
    assert hours["committed 1y no upfront"] == 0
    assert hours["committed 3y no upfront"] == 0
    assert result.cheapest.total(result.usage.hours_per_month) / 36 <= 5000
    text = result.recommendation
    assert text.startswith("spot is cheapest at 384.35 h/month")
    assert "384 h on spot, 212 h on on-demand" in text
    assert "It fits the $5,000/month budget." in text
