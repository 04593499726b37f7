"""The owned market: ranking with `owned` first or last, and the owned machine's TCO rate."""

from __future__ import annotations

import pytest

from optimizer.costs.owned import OwnedCost, breakdown, owned_cost, usd_per_gpu_hour
from optimizer.costs.tco import HOURS_PER_MONTH, Usage, on_prem, on_prem_plan
from optimizer.costs.tco_assumptions import Assumptions, OnPremAssumptions
from optimizer.model import Market
from policies.engine import evaluate
from tests.helpers.engine import T0, offer, policy


def test_owned_listed_first_ranks_ahead_of_every_cheaper_cloud_offer() -> None:
    spot = offer(market=Market.SPOT, usd_per_hour=1.0)
    od = offer(usd_per_hour=2.0)
    owned = offer(market=Market.OWNED, usd_per_hour=5.0)
    first = evaluate(policy(markets=["owned", "spot", "on_demand"]), [spot, od, owned], T0)
    assert [c.offer for c in first.candidates] == [owned, spot, od]
    last = evaluate(policy(markets=["spot", "on_demand", "owned"]), [spot, od, owned], T0)
    assert [c.offer for c in last.candidates] == [spot, od, owned]


def test_owned_between_other_markets_ranks_by_price() -> None:
    spot = offer(market=Market.SPOT, usd_per_hour=1.0)
    owned = offer(market=Market.OWNED, usd_per_hour=5.0)
    ranking = evaluate(policy(markets=["spot", "owned"]), [owned, spot], T0)
    assert [c.offer for c in ranking.candidates] == [spot, owned]


def test_default_markets_allow_owned() -> None:
    assert Market.OWNED in policy().markets


@pytest.mark.parametrize("u", [1.0, 0.5, 0.25])
def test_rate_times_busy_gpu_hours_is_the_on_prem_total_over_the_life(u: float) -> None:
    a = Assumptions(on_prem=OnPremAssumptions(depreciation_years=3, networking_usd_per_server=5000))
    cost = owned_cost(8, "H100-80GB", {"utilization": u}, a)
    usage = Usage("H100-80GB", 8, HOURS_PER_MONTH * u, 3)
    plan = on_prem_plan(usage, 700.0, 200_000.0, a)
    assert (cost.capex_usd, cost.power_kw) == (plan.capex_usd, plan.busy_kw)
    total = on_prem(usage, plan, a).total(usage.hours_per_month)
    busy_gpu_hours = 8 * usage.hours_per_month * usage.months
    assert usd_per_gpu_hour(cost) * busy_gpu_hours == pytest.approx(total, rel=1e-9)


def test_breakdown_parts_and_lower_utilization_costs_more() -> None:
    base = OwnedCost(2, 87_600.0, 1.0, 1.0, 0.5, 1.0, 0.1, 0.0, 1.0)
    parts = breakdown(base)
    assert parts == pytest.approx({"depreciation": 5.0, "operations": 0.0, "power": 0.05})
    half = OwnedCost(2, 87_600.0, 1.0, 1.0, 0.5, 1.0, 0.1, 0.0, 0.5)
    # half the busy hours: fixed costs double, idle power for the other half (0.05 x 0.5)
    assert breakdown(half) == pytest.approx(
        {"depreciation": 10.0, "operations": 0.0, "power": 0.075}
    )
    assert usd_per_gpu_hour(half) > usd_per_gpu_hour(base)


def test_unknown_override_is_named_with_a_close_spelling() -> None:
    with pytest.raises(ValueError, match=r"'capex' .*did you mean capex_usd"):
        owned_cost(1, "H100-80GB", {"capex": 1.0}, Assumptions())


def test_a_model_without_a_server_price_needs_capex_usd() -> None:
    with pytest.raises(ValueError, match="give capex_usd"):
        owned_cost(2, "T4", {}, Assumptions())
    cost = owned_cost(2, "T4", {"capex_usd": 10_000.0, "life_years": 4}, Assumptions())
    assert (cost.capex_usd, cost.life_years, cost.gpus) == (10_000.0, 4.0, 2)
