"""Recovery strategies, question by question (pure: no store, no clock, no processes)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

from optimizer.jobs.machine import AttemptView, Cooldown, JobView, Launch, decide
from optimizer.jobs.recovery import (
    DEFAULT,
    EagerOnDemand,
    Failover,
    Failure,
    GiveUp,
    LaunchError,
    Pool,
    RecoverySettings,
    Relaunch,
    SitOut,
    registered,
    strategies,
    strategy_for,
)
from optimizer.lifecycle import JobState
from optimizer.model import Market
from policies.loader import PolicyError, parse_policy
from policies.schema import recovery_strategies

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
POOL = ("aws", "eu-west-1", "euw1-az1", "p4d.24xlarge", "spot")
SETTINGS = RecoverySettings(
    max_restarts=3,
    pool_cooldown=timedelta(minutes=10),
    on_demand_after_interruptions=2,
    on_demand_window=timedelta(hours=1),
    quota_cooldown=timedelta(minutes=30),
    auth_cooldown=timedelta(minutes=90),
)
HEAD = "apiVersion: gpuopt/v1\nkind: Policy\nname: p\n"


def relaunch(answer: Relaunch | GiveUp) -> Relaunch:
    assert isinstance(answer, Relaunch), answer
    return answer


def test_the_schema_reads_the_installed_strategies() -> None:
    assert set(strategies()) == set(recovery_strategies())
    assert {"failover", "eager-on-demand"} <= set(strategies())  # found through entry points
    assert DEFAULT == "failover" and strategies()[DEFAULT] is Failover
    assert strategies()["eager-on-demand"] is EagerOnDemand


@dataclass(frozen=True, slots=True)
class GiveUpAtOnce(Failover):
    """A strategy only this test knows: any failure ends the job."""

    name: ClassVar[str] = "give-up-at-once"

    def after_failure(
        self, failure: Failure, pool: Pool, *, restarts: int, history: Any, now: datetime
    ) -> Relaunch | GiveUp:
        return GiveUp("no second chances", "gave up at once")


def test_a_registered_strategy_is_one_a_policy_may_name_and_then_decides() -> None:
    named = HEAD + "recovery:\n  strategy: give-up-at-once\n"
    with pytest.raises(PolicyError, match="unknown recovery strategy 'give-up-at-once'"):
        parse_policy(named)
    with registered(GiveUpAtOnce):
        strategy = strategy_for(parse_policy(named))
        answer = strategy.after_failure(Failure.PREEMPTED, POOL, restarts=0, history=(), now=NOW)
    assert isinstance(strategy, GiveUpAtOnce) and isinstance(answer, GiveUp)
    with pytest.raises(PolicyError, match="unknown recovery strategy 'give-up-at-once'"):
        parse_policy(named)


def test_a_policy_names_its_strategy_and_gives_its_settings() -> None:
    policy = parse_policy(
        HEAD + "markets: [spot]\n"
        "recovery:\n"
        "  strategy: eager-on-demand\n"
        "  max_restarts: 4\n"
        "  pool_cooldown_minutes: 5\n"
        "  on_demand_after_interruptions: 2\n"
        "  on_demand_window_minutes: 90\n"
        "  quota_cooldown_minutes: 15\n"
        "  auth_cooldown_minutes: 120\n"
    )
    strategy = strategy_for(policy)
    assert type(strategy) is EagerOnDemand
    assert strategy.settings == RecoverySettings(
        max_restarts=4,
        pool_cooldown=timedelta(minutes=5),
        on_demand_after_interruptions=2,
        on_demand_window=timedelta(minutes=90),
        quota_cooldown=timedelta(minutes=15),
        auth_cooldown=timedelta(minutes=120),
        on_demand_allowed=False,  # markets: [spot]
    )
    assert strategy_for(policy, max_restarts=9).settings.max_restarts == 9  # the job spec wins


def test_a_policy_without_a_recovery_section_gets_todays_behaviour() -> None:
    strategy = strategy_for(parse_policy(HEAD))
    assert strategy == Failover(RecoverySettings())
    assert strategy.settings.on_demand_window == timedelta(hours=1)
    assert strategy.settings.quota_cooldown == strategy.settings.auth_cooldown == timedelta(hours=1)


# -- failover ----------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", list(Failure))
def test_failover_cools_the_failed_pool_and_avoids_it(failure: Failure) -> None:
    answer = relaunch(
        Failover(SETTINGS).after_failure(failure, POOL, restarts=0, history=(), now=NOW)
    )
    assert answer == Relaunch(
        avoid=frozenset({POOL}), cooldowns=((POOL, NOW + timedelta(minutes=10)),)
    )


def test_failover_gives_up_past_the_restart_limit() -> None:
    strategy = Failover(SETTINGS)
    assert isinstance(
        strategy.after_failure(Failure.LOST, POOL, restarts=2, history=(), now=NOW), Relaunch
    )
    answer = strategy.after_failure(Failure.LOST, POOL, restarts=3, history=(), now=NOW)
    assert answer == GiveUp("restart limit 3 reached", "gave up after 3 restarts")


def test_failover_falls_back_to_on_demand_after_enough_interruptions_in_the_window() -> None:
    strategy = Failover(SETTINGS)
    recent = ((Failure.PREEMPTED, NOW - timedelta(minutes=20)),)
    answer = relaunch(
        strategy.after_failure(Failure.PREEMPTED, POOL, restarts=1, history=recent, now=NOW)
    )
    assert answer.markets == (Market.ON_DEMAND,)
    assert answer.note == "; 2 interruptions within an hour: falling back to on-demand"
    # only interruptions count: a failed probe now, after one interruption, does not
    answer = relaunch(
        strategy.after_failure(Failure.PROBE_FAILED, POOL, restarts=1, history=recent, now=NOW)
    )
    assert answer.markets is None and answer.note == ""
    # an interruption outside the window does not count either
    old = ((Failure.PREEMPTED, NOW - timedelta(minutes=61)),)
    answer = relaunch(
        strategy.after_failure(Failure.PREEMPTED, POOL, restarts=1, history=old, now=NOW)
    )
    assert answer.markets is None


def test_failover_stays_on_demand_while_pending_until_the_window_passes() -> None:
    strategy = Failover(SETTINGS)
    twice = tuple((Failure.PREEMPTED, NOW - timedelta(minutes=m)) for m in (30, 5))
    assert strategy.while_pending(twice, NOW).markets == (Market.ON_DEMAND,)
    assert strategy.while_pending(twice, NOW + timedelta(minutes=31)).markets is None
    assert strategy.while_pending(twice[1:], NOW) == Relaunch()


@pytest.mark.parametrize(
    "settings",
    [
        replace(SETTINGS, on_demand_allowed=False),
        replace(SETTINGS, on_demand_after_interruptions=0),
    ],
    ids=["policy-without-on-demand", "fallback-off"],
)
def test_failover_never_falls_back_when_it_may_not(settings: RecoverySettings) -> None:
    many = tuple((Failure.PREEMPTED, NOW - timedelta(minutes=m)) for m in range(1, 6))
    assert Failover(settings).while_pending(many, NOW).markets is None


def test_failover_prices_each_launch_error_from_its_settings() -> None:
    strategy = Failover(SETTINGS)
    assert strategy.after_launch_error(LaunchError.CAPACITY, NOW) == SitOut(
        pool_until=NOW + timedelta(minutes=10)
    )
    assert strategy.after_launch_error(LaunchError.QUOTA, NOW) == SitOut(
        pool_until=NOW + timedelta(minutes=30)
    )
    assert strategy.after_launch_error(LaunchError.AUTH, NOW) == SitOut(
        provider_until=NOW + timedelta(minutes=90)
    )


# -- eager-on-demand ---------------------------------------------------------------------------


@pytest.mark.parametrize("failure", list(Failure))
def test_eager_on_demand_goes_on_demand_after_any_first_failure(failure: Failure) -> None:
    answer = relaunch(
        EagerOnDemand(SETTINGS).after_failure(failure, POOL, restarts=0, history=(), now=NOW)
    )
    assert answer.markets == (Market.ON_DEMAND,)
    assert answer.avoid == frozenset({POOL}) and answer.cooldowns  # still avoids the pool
    assert answer.note == "; a failed attempt within an hour: on-demand at once (eager-on-demand)"


def test_eager_on_demand_lasts_the_window_and_respects_the_policy_markets() -> None:
    strategy = EagerOnDemand(SETTINGS)
    probe = ((Failure.PROBE_FAILED, NOW - timedelta(minutes=50)),)
    assert strategy.while_pending(probe, NOW).markets == (Market.ON_DEMAND,)
    assert strategy.while_pending(probe, NOW + timedelta(minutes=11)).markets is None
    spot_only = EagerOnDemand(replace(SETTINGS, on_demand_allowed=False))
    assert spot_only.while_pending(probe, NOW).markets is None


def test_eager_on_demand_keeps_the_restart_limit_and_the_launch_error_answers() -> None:
    eager, failover = EagerOnDemand(SETTINGS), Failover(SETTINGS)
    assert isinstance(
        eager.after_failure(Failure.LOST, POOL, restarts=3, history=(), now=NOW), GiveUp
    )
    for error in LaunchError:
        assert eager.after_launch_error(error, NOW) == failover.after_launch_error(error, NOW)


def test_decide_follows_the_strategy_it_is_given() -> None:
    """The same sick attempt: failover relaunches on the policy's markets, eager-on-demand on
    on-demand only; both cool the pool down for the strategy's pool cooldown."""
    job = JobView(id=7, name="train", state=JobState.PROBING)
    sick = AttemptView(
        number=1, key="7-1", pool=POOL, launched_at=NOW, registered=True, probe_status="fail"
    )
    where = "aws eu-west-1/euw1-az1 p4d.24xlarge spot"
    cooled = Cooldown(POOL, NOW + timedelta(minutes=10), f"GPU probe failed on {where}")
    plain = decide(job, sick, now=NOW, strategy=Failover(SETTINGS))
    eager = decide(job, sick, now=NOW, strategy=EagerOnDemand(SETTINGS))
    assert Launch(avoid=frozenset({POOL})) in plain.actions and cooled in plain.actions
    assert Launch(avoid=frozenset({POOL}), markets=(Market.ON_DEMAND,)) in eager.actions
    assert cooled in eager.actions and "eager-on-demand" in eager.reason
    waiting = replace(job, state=JobState.PENDING, failures=((Failure.PROBE_FAILED, NOW),))
    assert decide(waiting, None, now=NOW, strategy=Failover(SETTINGS)).actions == (Launch(),)
    assert decide(waiting, None, now=NOW, strategy=EagerOnDemand(SETTINGS)).actions == (
        Launch(markets=(Market.ON_DEMAND,)),
    )
