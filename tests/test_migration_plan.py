"""The pure pass that decides which running jobs move (optimizer/jobs/migration.py): each
trigger, the min_savings / min_stable / return_to_spot_after thresholds, the arithmetic the
event states, and the guards (min_runtime, max_per_day, the disruption budget) under a burst
of price changes across 20 jobs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from optimizer.jobs.migration import (
    MigrationSettings,
    Option,
    PolicyMarket,
    Reason,
    RunningJob,
    highest_since,
    plan,
)
from optimizer.model import Pool
from policies import rulebook
from policies.context import RuleContext
from policies.rule import BidCap, Priced
from policies.schema import Bid

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
ON = MigrationSettings(enabled=True)  # the defaults: 25%, 30 min, 30 min, 4/day, 10 min, 1


def spot(zone: str, kind: str = "g5.xlarge") -> Pool:
    return ("aws", zone[:-1], zone, kind, "spot")


def on_demand(region: str = "us-east-1", kind: str = "g5.xlarge") -> Pool:
    return ("aws", region, None, kind, "on_demand")


def job(
    pool: Pool,
    usd: float,
    *,
    id: int = 1,
    ran: timedelta = timedelta(hours=2),
    remaining: timedelta = timedelta(hours=10),
    overhead: timedelta = timedelta(minutes=6),
    moved: tuple[datetime, ...] = (),
    spot_allowed: bool = True,
    policy: str = "p",
) -> RunningJob:
    return RunningJob(
        id=id,
        name=f"job-{id}",
        policy=policy,
        pool=pool,
        usd_per_hour=usd,
        running_since=NOW - ran,
        remaining=remaining,
        remaining_note="max_duration 12h less 2 h run",
        overhead=overhead,
        overhead_note="measured",
        moved_at=moved,
        spot_allowed=spot_allowed,
    )


def steady(usd: float, since: timedelta = timedelta(hours=2)) -> list[tuple[datetime, float]]:
    """A price in effect since `since` ago."""
    return [(NOW - since, usd)]


def market(
    options: list[tuple[Pool, float]],
    *,
    settings: MigrationSettings = ON,
    refused: dict[Pool, str] | None = None,
    history: dict[Pool, list[tuple[datetime, float]]] | None = None,
    cooldowns: dict[Pool, datetime] | None = None,
    moving: int = 0,
    window: str | None = None,
) -> dict[str, PolicyMarket]:
    refused = refused or {}
    # the allowed offers, ranked by price (the pools the policy refuses are not among them)
    ranked = sorted((o for o in options if o[0] not in refused), key=lambda o: o[1])
    return {
        "p": PolicyMarket(
            name="p",
            settings=settings,
            options=[Option(pool, usd) for pool, usd in ranked],
            refused=refused,
            history=history if history is not None else {p: steady(u) for p, u in options},
            cooldowns=cooldowns or {},
            moving=moving,
            window=window,
        )
    }


A, B, C = spot("us-east-1a"), spot("us-east-1b"), spot("us-east-1c")


def test_a_price_above_the_bid_cap_moves_the_job_to_the_best_allowed_offer() -> None:
    offers = [(B, 0.60), (C, 0.55), (on_demand(), 1.00)]
    got = plan([job(A, 1.40)], market(offers, refused={A: "bid.max_usd_per_hour"}), NOW)
    [move] = got.moves
    assert move.reason is Reason.BID_CAP and move.job == "job-1"
    assert move.targets == (C, B, on_demand())  # rank order, its own pool left out
    assert move.from_usd == 1.40 and move.to_usd == 0.55
    assert "above the policy's bid cap (bid.max_usd_per_hour)" in move.message
    assert "moving to aws us-east-1c g5.xlarge spot at $0.5500/h" in move.message
    assert got.held == ()


class FlatCap(BidCap):
    """A bid cap registered from outside gpuopt, under an id of its own choosing."""

    id = "toy.flat_cap"

    def sets(self, bid: Bid) -> bool:
        return True

    def limit(self, bid: Bid, gpu_count: Any, on_demand: Any) -> Any:
        return 1.0

    def why(self, rules: RuleContext, priced: Priced) -> str | None:
        return f"${priced.usd_per_hour:g}/h > $1/h" if priced.usd_per_hour > 1.0 else None


@pytest.fixture
def flat_cap() -> Iterator[None]:
    rulebook.register(FlatCap(), before="budget")
    try:
        yield
    finally:
        rulebook.unregister(FlatCap.id)


def test_a_registered_bid_cap_is_a_bid_cap_whatever_its_id(flat_cap: None) -> None:
    # The rulebook says which rules are bid caps, not the id's spelling.
    got = plan([job(A, 1.40)], market([(B, 0.60)], refused={A: FlatCap.id}), NOW)
    [move] = got.moves
    assert move.reason is Reason.BID_CAP
    assert "above the policy's bid cap (toy.flat_cap)" in move.message


def test_a_rule_that_is_not_a_bid_cap_is_not_one_whatever_its_id() -> None:
    got = plan([job(A, 1.40)], market([(B, 0.60)], refused={A: "bid.nothing"}), NOW)
    [move] = got.moves
    assert move.reason is Reason.NOT_ALLOWED


def test_a_pool_the_policy_in_force_no_longer_allows_moves_and_says_which_window() -> None:
    got = plan(
        [job(A, 0.5)],
        market([(on_demand(), 1.0)], refused={A: "market"}, window="office-hours"),
        NOW,
    )
    [move] = got.moves
    assert move.reason is Reason.NOT_ALLOWED and move.targets == (on_demand(),)
    assert "the policy in force during window office-hours no longer allows" in move.message


@pytest.mark.parametrize("rule", ["stale", "budget"])
def test_a_stale_price_or_the_budget_rule_moves_nothing(rule: str) -> None:
    # B is cheaper, not by min_savings: only the refusal could move the job, and it does not
    assert plan([job(A, 0.5)], market([(B, 0.4)], refused={A: rule}), NOW).moves == ()


def test_with_nowhere_to_go_the_forced_move_is_held_with_the_reason() -> None:
    got = plan([job(A, 2.0)], market([], refused={A: "bid.max_usd_per_hour"}), NOW)
    assert got.moves == ()
    [held] = got.held
    assert held.reason is Reason.BID_CAP and held.why.endswith("no allowed offer to move to")


def test_a_disabled_policy_moves_nothing() -> None:
    off = MigrationSettings(enabled=False)
    got = plan([job(A, 2.0)], market([(B, 0.1)], settings=off, refused={A: "bid.x"}), NOW)
    assert got == plan([], {}, NOW)


# -- cheaper offers: min_savings, min_stable and the arithmetic -------------------------------


def test_an_offer_cheaper_by_less_than_min_savings_moves_nothing() -> None:
    # 24% cheaper for hours: under the 25% the policy asks for
    assert plan([job(A, 1.00)], market([(A, 1.00), (B, 0.76)]), NOW).moves == ()


def test_an_offer_cheaper_for_less_than_min_stable_moves_nothing() -> None:
    history = {
        A: steady(1.00),
        # 50% cheaper for 29 minutes; before that it was dearer than the job's pool
        B: [(NOW - timedelta(hours=1), 1.10), (NOW - timedelta(minutes=29), 0.50)],
    }
    assert plan([job(A, 1.00)], market([(A, 1.0), (B, 0.5)], history=history), NOW).moves == ()
    # a pool first seen 29 minutes ago cannot have been cheap for 30
    young = {A: steady(1.0), B: steady(0.5, timedelta(minutes=29))}
    assert plan([job(A, 1.00)], market([(A, 1.0), (B, 0.5)], history=young), NOW).moves == ()


def test_an_offer_cheaper_by_min_savings_for_min_stable_moves_the_job_stating_the_arithmetic() -> (
    None
):
    history = {
        A: steady(1.00),
        B: [(NOW - timedelta(hours=1), 1.10), (NOW - timedelta(minutes=31), 0.60)],
    }
    got = plan([job(A, 1.00)], market([(A, 1.0), (B, 0.6)], history=history), NOW)
    [move] = got.moves
    assert move.reason is Reason.CHEAPER and move.targets == (B,)
    # (1.00 - 0.60) x 10 h = $4.00 > 0.1 h x 0.60 = $0.06
    assert move.expected_saving_usd == pytest.approx(4.0)
    assert move.overhead_usd == pytest.approx(0.06)
    assert "is 40% cheaper than aws us-east-1a g5.xlarge spot at $1.0000/h" in move.message
    assert "(at least 25% for 30 min)" in move.message
    assert "saves ($1.0000/h - $0.6000/h) x 10.00 h remaining" in move.message
    assert "= $4.00 > restart overhead 0.100 h x $0.6000/h = $0.06 (measured)" in move.message


def test_a_spike_of_the_jobs_own_price_moves_nothing_until_the_gap_has_lasted() -> None:
    # B has cost 0.60 for hours; A cost 0.70 until 10 minutes ago, 1.00 since: B is 40%
    # cheaper now, but only 14% cheaper than A was 10 minutes ago
    history = {A: [(NOW - timedelta(hours=2), 0.70), (NOW - timedelta(minutes=10), 1.00)]}
    history[B] = steady(0.6)
    offers = [(A, 1.0), (B, 0.6)]
    assert plan([job(A, 1.00)], market(offers, history=history), NOW).moves == ()
    later = NOW + timedelta(minutes=21)  # the rise has lasted 31 minutes
    [move] = plan([job(A, 1.00)], market(offers, history=history), later).moves
    assert move.reason is Reason.CHEAPER and move.targets == (B,)


def test_a_saving_that_does_not_pay_for_the_restart_moves_nothing() -> None:
    nearly_done = job(A, 1.00, remaining=timedelta(minutes=5), overhead=timedelta(minutes=20))
    # (1.00 - 0.50) x 0.083 h = $0.04 < 0.333 h x 0.50 = $0.17
    assert plan([nearly_done], market([(A, 1.0), (B, 0.5)]), NOW).moves == ()


def test_only_offers_that_rank_above_the_jobs_own_are_targets() -> None:
    # ranked by price: B and C above A; D is cheaper than the job pays, but ranks below A
    pools = [(A, 0.40), (B, 0.20), (C, 0.30), (spot("us-east-1d"), 0.45)]
    [move] = plan([job(A, 0.9)], market(pools), NOW).moves
    assert move.targets == (B, C)


def test_highest_since_reads_the_price_in_effect_at_the_window_start() -> None:
    history = [(NOW - timedelta(hours=2), 3.0), (NOW - timedelta(hours=1), 1.0), (NOW, 2.0)]
    assert highest_since(history, NOW - timedelta(minutes=30)) == 2.0
    assert highest_since(history, NOW - timedelta(minutes=90)) == 3.0
    assert highest_since(history, NOW - timedelta(hours=3)) is None
    assert highest_since([], NOW) is None


# -- back to spot after an on-demand fallback -----------------------------------------------


def test_an_on_demand_job_returns_to_spot_once_spot_has_been_available_long_enough() -> None:
    od = on_demand()
    pools = [(A, 0.40), (od, 1.00)]
    # A sat out a cooldown (its capacity error) that ended 20 minutes ago: not yet
    recent = {A: NOW - timedelta(minutes=20)}
    got = plan([job(od, 1.0)], market(pools, cooldowns=recent), NOW)
    assert got.moves == ()
    # … and 31 minutes ago: back to spot
    settled = {A: NOW - timedelta(minutes=31)}
    [move] = plan([job(od, 1.0)], market(pools, cooldowns=settled), NOW).moves
    assert move.reason is Reason.RETURN_TO_SPOT and move.targets == (A,)
    assert "spot aws us-east-1a g5.xlarge spot at $0.4000/h has been available" in move.message
    # still cooling down: no
    cooling = {A: NOW + timedelta(minutes=1)}
    assert plan([job(od, 1.0)], market(pools, cooldowns=cooling), NOW).moves == ()


def test_no_return_to_spot_while_the_recovery_strategys_on_demand_fallback_holds() -> None:
    od = on_demand()
    pools = [(A, 0.40), (od, 1.00)]
    assert plan([job(od, 1.0, spot_allowed=False)], market(pools), NOW).moves == ()


def test_a_job_back_on_spot_stays_where_it_is() -> None:
    # after its return: the other spot zone is a little cheaper, not by min_savings
    pools = [(A, 0.40), (B, 0.35), (on_demand(), 1.00)]
    assert plan([job(A, 0.40)], market(pools), NOW).moves == ()


# -- guards -----------------------------------------------------------------------------------


def test_min_runtime_and_max_per_day_hold_a_move_back_and_say_why() -> None:
    forced = {A: "bid.max_usd_per_hour"}
    young = plan([job(A, 2.0, ran=timedelta(minutes=9))], market([(B, 0.5)], refused=forced), NOW)
    assert young.moves == ()
    assert young.held[0].why == "its attempt has run 9 min, less than min_runtime 10 min"
    busy = [NOW - timedelta(hours=h) for h in (1, 5, 9, 23)]
    tired = plan([job(A, 2.0, moved=tuple(busy))], market([(B, 0.5)], refused=forced), NOW)
    assert tired.moves == () and "moved 4 time(s) in the last 24 h" in tired.held[0].why
    busy[-1] = NOW - timedelta(hours=24)  # one of them a day ago: a move is allowed again
    [move] = plan([job(A, 2.0, moved=tuple(busy))], market([(B, 0.5)], refused=forced), NOW).moves
    assert move.reason is Reason.BID_CAP


def test_a_burst_of_price_changes_across_20_jobs_keeps_to_the_budget_and_max_per_day() -> None:
    settings = MigrationSettings(enabled=True, disruption_budget=3, max_per_day=2)
    zones = [spot(f"us-east-{n}a") for n in range(20)]
    cheap = [spot(f"eu-west-{n}a") for n in range(3)]
    # every job's pool jumped above the cap; job 0..4 moved twice today already
    jobs = [
        job(
            pool,
            2.0,
            id=n,
            moved=(NOW - timedelta(hours=3), NOW - timedelta(hours=2)) if n < 5 else (),
        )
        for n, pool in enumerate(zones)
    ]
    offers = [(p, 0.5 + i / 10) for i, p in enumerate(cheap)] + [(p, 2.0) for p in zones]
    # (the jobs' own pools are refused, so not among the allowed offers)
    refused = dict.fromkeys(zones, "bid.max_usd_per_hour")
    got = plan(jobs, market(offers, settings=settings, refused=refused, moving=1), NOW)
    # one job already moving: two more may start, the lowest ids of those allowed to move
    assert [m.job_id for m in got.moves] == [5, 6]
    assert all(m.reason is Reason.BID_CAP and m.targets[0] == cheap[0] for m in got.moves)
    held = {h.job_id: h.why for h in got.held}
    assert sorted(held) == [n for n in range(20) if n not in (5, 6)]
    assert all("max_per_day 2" in held[n] for n in range(5))
    assert all("disruption budget of 3" in held[n] for n in range(7, 20))
    # with the budget used up by moves in flight, nothing at all
    full = plan(jobs, market(offers, settings=settings, refused=refused, moving=3), NOW)
    assert full.moves == ()


def test_forced_moves_go_before_returns_to_spot_and_those_before_cheaper_offers() -> None:
    od = on_demand()
    history = {A: steady(0.3), B: steady(0.2), C: steady(1.0), od: steady(1.0)}
    offers = [(B, 0.2), (A, 0.3), (C, 1.0), (od, 1.0)]
    jobs = [
        job(C, 1.0, id=1),  # B is 80% cheaper, stable: a cheaper move
        job(od, 1.0, id=2),  # spot has been there for 2 h: back to spot
        job(A, 0.3, id=3),  # above the cap
    ]
    refused = {A: "bid.max_fraction_of_on_demand"}
    for budget, moved in ((1, [3]), (2, [3, 2]), (3, [3, 2, 1])):
        settings = MigrationSettings(enabled=True, disruption_budget=budget)
        got = plan(jobs, market(offers, settings=settings, refused=refused, history=history), NOW)
        assert [m.job_id for m in got.moves] == moved
    reasons = {m.job_id: m.reason for m in got.moves}
    assert reasons == {1: Reason.CHEAPER, 2: Reason.RETURN_TO_SPOT, 3: Reason.BID_CAP}
