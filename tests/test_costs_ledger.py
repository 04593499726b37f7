"""The ledger's model against hand-computed cases (docs/costs.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from optimizer.costs import (
    Cost,
    GroupBy,
    Line,
    Usage,
    cost,
    group_lines,
    integral_usd,
    month_windows,
    total,
)
from optimizer.costs.ledger import gaps, storage_usd
from providers.aws import BILLING as AWS
from providers.gcp import BILLING as GCP

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
H = timedelta(hours=1)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def spot(start: float, end: float | None, price: float = 2.0, **kw: object) -> Usage:
    return Usage(
        provider=str(kw.pop("provider", "aws")),
        market="spot",
        launched=at(start),
        terminated=None if end is None else at(end),
        launch_usd_per_hour=price,
        **kw,  # type: ignore[arg-type]
    )


ON_DEMAND_10 = [(T0 - timedelta(days=1), 10.0)]


def test_the_integral_follows_each_price_change_inside_the_attempt() -> None:
    prices = [(at(30), 3.0), (at(60), 1.0)]
    c = cost(spot(0, 90), at(200), prices=prices, on_demand=ON_DEMAND_10)
    # 30 min at the launch price 2, 30 at 3, 30 at 1
    assert c.spend_usd == pytest.approx(1.0 + 1.5 + 0.5)
    assert c.billed_seconds == 5400
    assert c.on_demand_usd == pytest.approx(15.0)
    assert c.savings_usd == pytest.approx(12.0)
    assert c.savings_fraction == pytest.approx(0.8)


def test_a_spot_observation_before_the_launch_does_not_set_its_price() -> None:
    prices = [(at(-10), 5.0), (at(30), 3.0)]
    c = cost(spot(0, 60), at(60), prices=prices, on_demand=ON_DEMAND_10)
    assert c.spend_usd == pytest.approx(1.0 + 1.5)  # the launch price until minute 30


def test_an_attempt_shorter_than_the_minimum_is_billed_the_minimum() -> None:
    od = Usage("aws", "on_demand", at(0), at(0) + timedelta(seconds=20), 36.0)
    c = cost(od, at(10))
    assert c.billed_seconds == 60
    assert c.spend_usd == pytest.approx(0.60)
    assert c.on_demand_usd == pytest.approx(0.60) and c.savings_usd == pytest.approx(0.0)


def test_aws_charges_nothing_for_spot_it_interrupts_in_the_first_hour_but_storage_counts() -> None:
    ours = spot(0, 50, disk_gib=100.0)
    theirs = spot(0, 50, disk_gib=100.0, interrupted_by_cloud=True)
    paid = cost(ours, at(60), on_demand=ON_DEMAND_10)
    free = cost(theirs, at(60), on_demand=ON_DEMAND_10)
    assert paid.spend_usd == pytest.approx(2.0 * 50 / 60)
    assert free.spend_usd == 0.0 and free.refunded and free.billed_seconds == 0
    days = 31  # March
    assert free.storage_usd == pytest.approx(100 * 0.08 * 3000 / (86400 * days))
    assert free.storage_usd == pytest.approx(paid.storage_usd)
    assert free.on_demand_usd == pytest.approx(10.0 * 50 / 60)  # the credit is a saving
    late = cost(spot(0, 61, interrupted_by_cloud=True), at(70), on_demand=ON_DEMAND_10)
    assert late.spend_usd == pytest.approx(2.0 * 61 / 60) and not late.refunded


def test_gcp_credits_spot_preempted_only_in_its_first_minute() -> None:
    early = spot(0, 0.5, provider="gcp", interrupted_by_cloud=True)
    later = spot(0, 2, provider="gcp", interrupted_by_cloud=True)
    assert cost(early, at(5)).spend_usd == 0.0
    assert cost(later, at(5)).spend_usd == pytest.approx(2.0 * 2 / 60)
    assert GCP.interrupted_free_s == 60 and AWS.interrupted_free_s == 3600


def test_an_attempt_across_a_month_boundary_splits_exactly_between_the_months() -> None:
    launched = datetime(2026, 1, 31, 23, 0, tzinfo=UTC)
    usage = Usage("aws", "on_demand", launched, launched + 2 * H, 6.0, disk_gib=50.0)
    now = launched + 3 * H
    jan, feb = month_windows(launched, launched + 2 * H)
    assert jan == (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC))
    in_jan, in_feb = cost(usage, now, window=jan), cost(usage, now, window=feb)
    assert (in_jan.spend_usd, in_feb.spend_usd) == (pytest.approx(6.0), pytest.approx(6.0))
    assert in_jan.billed_seconds == in_feb.billed_seconds == 3600
    # each month's hour at that month's days
    assert in_jan.storage_usd == pytest.approx(50 * 0.08 * 3600 / (86400 * 31))
    assert in_feb.storage_usd == pytest.approx(50 * 0.08 * 3600 / (86400 * 28))
    whole = cost(usage, now)
    assert total([in_jan, in_feb]).spend_usd == pytest.approx(whole.spend_usd)
    assert total([in_jan, in_feb]).storage_usd == pytest.approx(whole.storage_usd)


def test_a_live_attempt_accrues_up_to_now() -> None:
    live = spot(0, None, price=3.0)
    assert cost(live, at(40)).spend_usd == pytest.approx(2.0)
    assert cost(live, at(80)).spend_usd == pytest.approx(4.0)
    assert cost(live, at(80)).billed_seconds == 4800


def test_overhead_is_the_billed_time_the_job_did_not_run_priced_when_it_fell() -> None:
    prices = [(at(5), 6.0)]
    usage = spot(0, 90, running=((at(10), at(80)),))
    c = cost(usage, at(100), prices=prices, on_demand=ON_DEMAND_10)
    # idle 0-10 (5 min at 2, 5 at 6) and 80-90 (10 min at 6)
    assert c.overhead_seconds == 1200
    assert c.overhead_usd == pytest.approx(2 * 5 / 60 + 6 * 5 / 60 + 6 * 10 / 60)
    assert c.net_savings_fraction == pytest.approx(
        (c.on_demand_usd - c.spend_usd - c.overhead_usd) / c.on_demand_usd
    )


def test_a_running_job_with_no_end_runs_to_the_termination() -> None:
    usage = spot(0, 60, running=((at(15), None),))
    assert cost(usage, at(70)).overhead_seconds == 900


def test_a_spot_attempt_without_an_on_demand_series_has_an_unknown_baseline() -> None:
    c = cost(spot(0, 60), at(60))
    assert not c.baseline_known and c.on_demand_usd == 0.0
    assert not total([c, cost(spot(0, 60), at(60), on_demand=ON_DEMAND_10)]).baseline_known


def test_a_window_outside_the_attempt_costs_nothing() -> None:
    c = cost(spot(0, 60), at(60), window=(at(120), at(180)))
    assert c == Cost(baseline_known=False)


def test_storage_for_a_whole_month_is_the_monthly_price() -> None:
    april = (datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 5, 1, tzinfo=UTC))
    assert storage_usd(100, 0.08, april) == pytest.approx(8.0)


def test_gaps_and_the_step_integral_on_edges() -> None:
    span = (at(0), at(60))
    assert gaps(span, [(at(-5), at(10)), (at(20), at(30)), (at(25), at(40))]) == [
        (at(10), at(20)),
        (at(40), at(60)),
    ]
    assert gaps(span, []) == [span]
    assert integral_usd([(at(0), 4.0)], 1.0, at(0), at(30)) == pytest.approx(2.0)
    assert integral_usd([(at(30), 4.0)], 1.0, at(0), at(30)) == pytest.approx(0.5)
    assert integral_usd([], 1.0, at(10), at(0)) == 0.0


def line(job: str, month: int, spend: float, market: str = "spot") -> Line:
    start = datetime(2026, month, 1, tzinfo=UTC)
    return Line(
        job_id=1,
        job=job,
        policy="p",
        attempt=1,
        provider="aws",
        region="us-east-1",
        zone=None,
        instance_type="p5.48xlarge",
        market=market,
        instance_id=None,
        launched=start,
        ended=None,
        period_start=start,
        period_end=datetime(2026, month + 1, 1, tzinfo=UTC),
        cost=Cost(billed_seconds=3600, spend_usd=spend, on_demand_usd=2 * spend),
    )


def test_lines_group_by_month_and_job_with_summed_costs() -> None:
    lines = [line("a", 2, 1.0), line("b", 1, 2.0), line("a", 1, 4.0, market="on_demand")]
    months = group_lines(lines, GroupBy.MONTH)
    assert [(g.key, g.cost.spend_usd, len(g.lines)) for g in months] == [
        ("2026-01", 6.0, 2),
        ("2026-02", 1.0, 1),
    ]
    jobs = group_lines(lines, GroupBy.JOB)
    assert [(g.key, g.cost.spend_usd, g.cost.savings_usd) for g in jobs] == [
        ("a", 5.0, 5.0),
        ("b", 2.0, 2.0),
    ]
    assert [g.key for g in group_lines(lines, GroupBy.MARKET)] == ["on_demand", "spot"]
