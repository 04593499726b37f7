"""The ledger over the store: attempts and price history in, cost lines out, frozen once an
attempt has ended (optimizer/jobs/ledger.py), on SQLite and PostgreSQL. Every figure is
computed by hand in the comments beside it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from optimizer.costs import GroupBy, group_lines
from optimizer.costs.lines import Totals, totals_by
from optimizer.jobs import budget as job_budget
from optimizer.jobs.ledger import SETTLE, Ledger
from optimizer.model import Market
from optimizer.store import Store
from policies.table import OfferTable
from tests.helpers import make_offer
from tests.helpers.costs import T0, at, attempt, ended, observe

LATER = T0 + timedelta(days=2)  # "now" for most queries: every attempt below has ended by then


def spot_prices(store: Store) -> None:
    observe(store, at(-10), 5.0)  # before the launch: not the attempt's price
    observe(store, at(30), 0.60)
    observe(store, at(60), 0.20)
    # on-demand in the attempt's zone: $1.00/h, then $1.20/h from minute 45
    observe(store, T0 - timedelta(days=1), 1.00, market=Market.ON_DEMAND)
    observe(store, at(45), 1.20, market=Market.ON_DEMAND)


def test_an_ended_spot_attempt_is_priced_from_its_pool_and_the_on_demand_series(
    store: Store,
) -> None:
    spot_prices(store)
    attempt(store, "train", job_started=at(10), job_exited=at(80), disk_gib=100.0, **ended(90))
    (line,) = Ledger(store).lines(now=LATER)
    c = line.cost
    assert c.billed_seconds == 90 * 60
    # 30 min at the launch price 0.40, 30 at 0.60, 30 at 0.20
    assert c.spend_usd == pytest.approx(0.20 + 0.30 + 0.10)
    # 45 min at 1.00, 45 at 1.20
    assert c.on_demand_usd == pytest.approx(0.75 + 0.90)
    # not running: minutes 0-10 at 0.40 and 80-90 at 0.20
    assert c.overhead_seconds == 20 * 60
    assert c.overhead_usd == pytest.approx(0.40 / 6 + 0.20 / 6)
    # gp3 at $0.08/GiB-month: 100 GiB x 5,400 s of March's 31 days
    assert c.storage_usd == pytest.approx(100 * 0.08 * 5400 / (86400 * 31))
    assert c.savings_fraction == pytest.approx(1.05 / 1.65)
    assert (line.launched, line.ended, line.frozen) == (T0, at(90), False)
    assert (line.job, line.policy, line.attempt, line.instance_id) == (
        "train",
        "team",
        1,
        "i-train-1",
    )


def test_freezing_keeps_an_ended_attempts_numbers_when_its_price_points_go(
    store: Store,
) -> None:
    spot_prices(store)
    attempt(store, "train", job_started=at(10), job_exited=at(80), **ended(90))
    ledger = Ledger(store)
    (priced,) = ledger.lines(now=LATER)
    assert ledger.freeze(LATER) == 1
    assert ledger.freeze(LATER) == 0  # idempotent: nothing left to freeze
    # the raw points are gone (downsampled, pruned): the frozen line does not need them
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM price_history")
    (frozen,) = ledger.lines(now=LATER + timedelta(days=30))
    assert frozen.frozen
    assert frozen.cost == priced.cost
    assert (frozen.launched, frozen.ended, frozen.zone) == (
        priced.launched,
        priced.ended,
        "use1-az1",
    )


def test_frozen_lines_are_read_without_a_price_query(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    spot_prices(store)
    for n in range(1, 4):
        attempt(store, f"job{n}", **ended(90))
    ledger = Ledger(store)
    assert ledger.freeze(LATER, limit=2) == 2  # a batch per pass: the oldest first
    assert {line.frozen for line in ledger.lines(job="job3", now=LATER)} == {False}
    assert ledger.freeze(LATER) == 1

    def no_prices(*_: Any, **__: Any) -> Any:
        raise AssertionError("a frozen attempt was priced again")

    monkeypatch.setattr(store.prices, "price_history", no_prices)
    monkeypatch.setattr(store.prices, "price_histories", no_prices)
    lines = ledger.lines(now=LATER)
    assert [line.job for line in lines] == ["job1", "job2", "job3"]
    assert all(line.frozen for line in lines)


def test_an_attempt_across_a_month_boundary_is_split_between_the_months(store: Store) -> None:
    end_of_march = datetime(2026, 3, 31, 23, 0, tzinfo=UTC)
    observe(store, end_of_march - timedelta(days=1), 2.0, market=Market.ON_DEMAND)
    key = attempt(store, "long", launched=end_of_march)
    store.jobs.update_attempt(
        key,
        ended_at=end_of_march + timedelta(hours=3),
        terminated_at=end_of_march + timedelta(hours=3),
        terminated_by="gpuopt",
        instance_gone=True,
    )
    ledger = Ledger(store)
    march, april = ledger.lines(now=LATER + timedelta(days=30))
    assert (march.month, april.month) == ("2026-03", "2026-04")
    assert march.cost.billed_seconds == 3600 and april.cost.billed_seconds == 7200
    assert march.cost.spend_usd == pytest.approx(0.40)  # no spot point: the launch price
    assert april.cost.spend_usd == pytest.approx(0.80)
    assert march.cost.on_demand_usd == pytest.approx(2.0)
    assert april.cost.on_demand_usd == pytest.approx(4.0)
    now = LATER + timedelta(days=30)
    ledger.freeze(now)
    # --since/--until pick the months that overlap them
    (only_april,) = ledger.lines(since=datetime(2026, 4, 2, tzinfo=UTC), now=now)
    assert only_april.frozen and only_april.cost == april.cost
    (only_march,) = ledger.lines(until=datetime(2026, 3, 15, tzinfo=UTC), now=now)
    assert only_march.cost == march.cost
    by_month = group_lines(ledger.lines(now=now), GroupBy.MONTH)
    assert [(g.key, round(g.cost.spend_usd, 6)) for g in by_month] == [
        ("2026-03", 0.4),
        ("2026-04", 0.8),
    ]


def test_a_live_attempt_accrues_to_now_and_is_not_frozen(store: Store) -> None:
    observe(store, at(30), 0.80)
    attempt(store, "live", job_started=at(5))
    ledger = Ledger(store)
    (line,) = ledger.lines(now=at(60))
    # 30 min at 0.40, 30 at 0.80; not running for the first 5 minutes
    assert line.ended is None
    assert line.cost.billed_seconds == 3600
    assert line.cost.spend_usd == pytest.approx(0.20 + 0.40)
    assert line.cost.overhead_usd == pytest.approx(0.40 * 5 / 60)
    assert not line.cost.baseline_known  # no on-demand series of g5.xlarge in us-east-1
    assert ledger.freeze(at(60)) == 0
    (later,) = ledger.lines(now=at(90))
    assert later.cost.spend_usd == pytest.approx(0.20 + 0.80)


def test_an_ended_attempt_without_a_reported_termination_settles_on_its_end(
    store: Store,
) -> None:
    key = attempt(store, "quiet")
    store.jobs.update_attempt(key, ended_at=at(30), state="ended", instance_gone=True)
    ledger = Ledger(store)
    # not frozen yet: the provider may still report when the instance really went
    assert ledger.freeze(at(30) + SETTLE - timedelta(seconds=1)) == 0
    (line,) = ledger.lines(now=at(45))
    assert line.ended == at(30) and line.cost.spend_usd == pytest.approx(0.20)
    assert ledger.freeze(at(30) + SETTLE) == 1
    # an ended attempt whose instance is not known gone still bills: to now, unfrozen
    other = attempt(store, "lingering")
    store.jobs.update_attempt(other, ended_at=at(30), state="ended")
    assert ledger.freeze(LATER) == 0
    lingering = ledger.lines(job="lingering", now=at(120))
    assert [(x.ended, x.cost.billed_seconds) for x in lingering] == [(None, 7200)]


def test_a_spot_instance_the_cloud_reclaims_in_its_first_hour_costs_nothing(
    store: Store,
) -> None:
    observe(store, T0 - timedelta(days=1), 1.0, market=Market.ON_DEMAND)
    attempt(store, "reclaimed", disk_gib=50.0, **ended(40, by="cloud"))
    attempt(store, "terminated", **ended(40, by="gpuopt"))
    reclaimed, terminated = Ledger(store).lines(now=LATER)
    assert reclaimed.cost.refunded and reclaimed.cost.spend_usd == 0.0
    assert reclaimed.cost.on_demand_usd == pytest.approx(40 / 60)  # the credit is a saving
    assert reclaimed.cost.storage_usd == pytest.approx(50 * 0.08 * 2400 / (86400 * 31))
    assert not terminated.cost.refunded
    assert terminated.cost.spend_usd == pytest.approx(0.40 * 40 / 60)


def test_the_baseline_falls_back_to_the_regions_zoneless_on_demand_series(store: Store) -> None:
    # the local cloud lists on-demand per region (zone None); AWS and GCP per zone
    observe(store, T0 - timedelta(days=1), 3.0, market=Market.ON_DEMAND, zone=None)
    attempt(store, "regional", **ended(60))
    observe(store, T0 - timedelta(days=1), 2.0, market=Market.ON_DEMAND, zone="use1-az2")
    attempt(store, "zoned", zone="use1-az2", **ended(60))
    regional, zoned = Ledger(store).lines(now=LATER)
    assert regional.cost.on_demand_usd == pytest.approx(3.0)
    assert zoned.cost.on_demand_usd == pytest.approx(2.0)  # its own zone's series first


def test_an_on_demand_attempt_costs_its_list_price_and_saves_nothing(store: Store) -> None:
    observe(store, T0 - timedelta(days=1), 1.0, market=Market.ON_DEMAND, zone=None)
    attempt(store, "od", market=Market.ON_DEMAND, zone=None, usd_per_hour=1.0, **ended(30))
    (line,) = Ledger(store).lines(now=LATER)
    assert line.cost.spend_usd == pytest.approx(0.5)
    assert line.cost.on_demand_usd == pytest.approx(0.5)
    assert line.cost.savings_usd == pytest.approx(0.0)


def test_lines_filter_by_job_policy_provider_and_market_frozen_or_not(store: Store) -> None:
    attempt(store, "a", policy="red", **ended(60))
    attempt(store, "b", policy="blue", **ended(60))
    attempt(store, "c", policy="blue", provider="gcp", region="us-central1", zone="us-central1-a")
    ledger = Ledger(store)
    ledger.freeze(LATER)

    def jobs(**kw: Any) -> list[str]:
        return [line.job for line in ledger.lines(now=LATER, **kw)]

    assert jobs() == ["a", "b", "c"]
    assert jobs(job="b") == ["b"]
    assert jobs(job="nobody") == []
    assert jobs(policy="blue") == ["b", "c"]
    assert jobs(provider="gcp") == ["c"]
    assert jobs(market="on_demand") == []
    # the ledger's unit is a month: a window inside March selects March's lines whole
    assert jobs(since=datetime(2026, 3, 20, tzinfo=UTC)) == ["a", "b", "c"]
    assert jobs(since=datetime(2026, 4, 1, tzinfo=UTC)) == []
    assert jobs(until=datetime(2026, 3, 1, tzinfo=UTC)) == []


def test_the_total_is_the_sum_of_the_lines_with_the_frozen_part_summed_in_the_database(
    store: Store,
) -> None:
    spot_prices(store)
    attempt(store, "a", job_started=at(10), job_exited=at(80), disk_gib=10.0, **ended(90))
    attempt(store, "b", launched=at(20), job_started=at(21))  # live
    ledger = Ledger(store)
    ledger.freeze(LATER)
    lines = ledger.lines(now=at(200))
    assert [line.frozen for line in lines] == [True, False]
    got = ledger.total(now=at(200))
    for name in ("billed_seconds", "spend_usd", "storage_usd", "overhead_seconds", "overhead_usd"):
        assert getattr(got, name) == pytest.approx(sum(getattr(x.cost, name) for x in lines))
    assert got.on_demand_usd == pytest.approx(sum(x.cost.on_demand_usd for x in lines))
    assert ledger.total(policy="other", now=at(200)).spend_usd == 0.0


def test_the_budget_counts_the_ledgers_spend_and_live_attempts_at_their_current_price(
    store: Store,
) -> None:
    # an ended attempt: spot price moved from 0.40 to 0.60 and 0.20 ($0.60 over 90 minutes,
    # not 90 minutes at its $0.40 launch price), and a live one launched at $0.40/h
    spot_prices(store)
    attempt(store, "done", **ended(90))
    attempt(store, "running", launched=at(60))
    now = at(120)
    offers = [make_offer(usd_per_hour=0.25, observed_at=now)]  # the pool's current price
    spend = job_budget.committed(store, "team", now, offers)
    # done: $0.60; running: 60 min at 0.20, the point observed at its launch
    assert spend.spent_usd == pytest.approx(0.60 + 0.20)
    assert (spend.live_attempts, spend.live_usd_per_hour) == (1, pytest.approx(0.25))
    # the job being replaced counts for what it spent, not for the rest of the month
    running = store.jobs.get_job("running")
    assert running is not None
    replaced = job_budget.committed(store, "team", now, offers, replacing=running.id)
    assert replaced.spent_usd == pytest.approx(spend.spent_usd) and replaced.live_attempts == 0
    # The latest offers as a table (what a launch ranks) give the same current prices, found
    # by column, with another pool and a dearer regional offer beside the attempt's.
    listed = [
        *offers,
        make_offer(zone=None, usd_per_hour=0.9, observed_at=now),
        make_offer(zone="use1-az9", usd_per_hour=0.1, observed_at=now),
    ]
    assert job_budget.committed(store, "team", now, OfferTable.from_offers(listed)) == (
        job_budget.committed(store, "team", now, listed)
    )
    assert job_budget.committed(store, "team", now, OfferTable.from_offers(listed)) == spend


def test_the_reconcile_pass_freezes_what_ended(store: Store) -> None:
    from optimizer.jobs.context import ReconcileContext
    from optimizer.jobs.ledger import CostFreezer
    from tests.helpers.jobs import Drafter

    attempt(store, "a", **ended(30))
    attempt(store, "b")  # live
    ctx = ReconcileContext(LATER, (), {}, store, {}, Drafter(), lambda: LATER)
    freezer = CostFreezer()
    freezer(ctx)
    freezer(ctx)  # a pass run twice changes nothing
    assert [(line.job, line.frozen) for line in Ledger(store).lines(now=LATER)] == [
        ("a", True),
        ("b", False),
    ]
    assert len(store.costs.frozen_lines()) == 1


@pytest.mark.parametrize("by", list(GroupBy))
def test_groups_summed_by_the_database_match_the_lines_summed(store: Store, by: GroupBy) -> None:
    spot_prices(store)
    end_of_march = datetime(2026, 3, 31, 23, 0, tzinfo=UTC)
    attempt(store, "a", policy="red", job_started=at(10), disk_gib=8.0, **ended(90))
    attempt(store, "a", 2, policy="red", **ended(120, by="cloud"))
    attempt(store, "b", policy="blue", zone="use1-az9", **ended(60))  # no on-demand series
    attempt(store, "c", policy="blue", market=Market.ON_DEMAND, zone=None, usd_per_hour=1.0)
    attempt(store, "d", policy="red", launched=end_of_march, job_started=end_of_march)  # live
    now = datetime(2026, 4, 2, tzinfo=UTC)
    ledger = Ledger(store)
    assert ledger.freeze(now) == 3
    lines = ledger.lines(now=now)
    assert sorted({line.frozen for line in lines}) == [False, True]
    expected = totals_by(lines, by, markets=True)

    def same(got: list[Totals], expected: list[Totals]) -> None:
        assert [g.key for g in got] == [g.key for g in expected]
        for mine, theirs in zip(got, expected, strict=True):
            assert mine.attempts == theirs.attempts, mine.key
            for part in ("cost", "priced"):
                a, b = getattr(mine, part), getattr(theirs, part)
                for figure in ("billed_seconds", "spend_usd", "storage_usd", "on_demand_usd"):
                    assert getattr(a, figure) == pytest.approx(getattr(b, figure)), (part, figure)
                assert (a.overhead_usd, a.baseline_known) == (
                    pytest.approx(b.overhead_usd),
                    b.baseline_known,
                )

    same(ledger.groups(by, now=now), expected)
    assert all(not g.markets for g in ledger.groups(by, now=now))
    # split by market from the same reads: each group's parts, and the parts add up to it
    split = ledger.groups(by, markets=True, now=now)
    same(split, expected)
    assert {m.key for g in split for m in g.markets} == {"spot", "on_demand"}
    for group, theirs in zip(split, expected, strict=True):
        same(list(group.markets), list(theirs.markets))
        assert sum(m.cost.spend_usd for m in group.markets) == pytest.approx(group.cost.spend_usd)
    assert ledger.groups(by, policy="nobody", now=now) == []
