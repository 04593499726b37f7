"""The deadline model and what each strategy decides in situations worked out by hand."""

from __future__ import annotations

import pytest

from policies.deadline import (
    STRATEGIES,
    Situation,
    Use,
    ZoneStats,
    at_risk,
    missed,
    slack_s,
    strategy,
)

H = 3600.0


def situation(**changes: object) -> Situation:
    base: dict[str, object] = dict(
        elapsed_s=10 * H,
        deadline_s=52 * H,
        work_left_s=38 * H,
        overhead_s=0.2 * H,
        running=Use.WAIT,
        zone=None,
        spot_now=frozenset(),
        interval_s=300.0,
        work_s=48 * H,
    )
    base.update(changes)
    return Situation(**base)  # type: ignore[arg-type]


def test_slack_counts_one_restart_unless_on_demand_runs() -> None:
    assert slack_s(situation()) == pytest.approx(3.8 * H)
    assert slack_s(situation(running=Use.ON_DEMAND)) == pytest.approx(4 * H)


def test_at_risk_once_the_slack_no_longer_pays_for_a_restart_and_missed_after_the_deadline() -> (
    None
):
    assert not at_risk(situation())
    assert at_risk(situation(work_left_s=41.9 * H))  # slack 0.1 h < 0.2 h
    assert not missed(situation(elapsed_s=52 * H))
    assert missed(situation(elapsed_s=52 * H + 1))
    assert not missed(situation(elapsed_s=53 * H, work_left_s=0.0))


def test_the_registry_names_three_strategies_and_gpuopt_is_the_default() -> None:
    assert set(STRATEGIES) == {"gpuopt", "greedy", "uniform-progress"}
    assert strategy().name == "gpuopt"
    with pytest.raises(KeyError, match="known: gpuopt, greedy, uniform-progress"):
        strategy("eager")


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_goes_on_demand_once_the_slack_is_down_to_a_restart_and_an_interval(
    name: str,
) -> None:
    # slack 0.2 h - 1 s < 0.2 h restart + 300 s interval, spot available
    tight = situation(work_left_s=41.6 * H - 300 + 1, spot_now=frozenset({"a"}))
    decision = strategy(name).decide(tight)
    assert decision.use is Use.ON_DEMAND and decision.zone is None
    assert decision.reason


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_on_demand_is_not_left_without_slack_for_two_restarts(name: str) -> None:
    # on on-demand, slack 0.7 h < restart + interval + two restarts + interval (0.77 h)
    held = situation(running=Use.ON_DEMAND, work_left_s=41.3 * H, spot_now=frozenset({"a"}))
    assert strategy(name).decide(held).use is Use.ON_DEMAND


def test_greedy_takes_any_spot_and_otherwise_waits_and_stays_on_on_demand() -> None:
    greedy = strategy("greedy")
    assert greedy.decide(situation(spot_now=frozenset({"b", "a"}))).use is Use.SPOT
    assert greedy.decide(situation()).use is Use.WAIT
    roomy = situation(running=Use.ON_DEMAND, spot_now=frozenset({"a"}))
    assert greedy.decide(roomy).use is Use.ON_DEMAND


def test_uniform_progress_runs_on_demand_when_behind_the_line_and_waits_when_ahead() -> None:
    up = strategy("uniform-progress")
    # 10 h of 52 h: the line is 48 x 10 / 52 = 9.23 h of work; 10 h done is ahead
    assert up.decide(situation()).use is Use.WAIT
    behind = situation(work_left_s=39 * H)  # 9 h done
    assert up.decide(behind).use is Use.ON_DEMAND
    assert up.decide(situation(work_left_s=39 * H, spot_now=frozenset({"a"}))).zone == "a"


def test_spot_stays_in_its_zone_and_otherwise_goes_where_up_spells_are_longest() -> None:
    stats = {
        "a": ZoneStats(observed_s=100 * H, available_s=50 * H, interruptions=50),
        "b": ZoneStats(observed_s=100 * H, available_s=90 * H, interruptions=3),
    }
    for name in STRATEGIES:
        fresh = situation(spot_now=frozenset({"a", "b"}), stats=stats)
        assert strategy(name).decide(fresh).zone == "b"
        staying = situation(running=Use.SPOT, zone="a", spot_now=frozenset({"a", "b"}))
        assert strategy(name).decide(staying).zone == "a"


def test_gpuopt_waits_out_a_down_spell_while_the_slack_is_plentiful() -> None:
    steady = {"a": ZoneStats(observed_s=168 * H, available_s=160 * H, interruptions=4)}
    roomy = situation(deadline_s=70 * H, stats=steady)
    decision = strategy("gpuopt").decide(roomy)
    assert decision.use is Use.WAIT and not decision.at_risk


def test_gpuopt_rides_on_demand_through_a_down_spell_when_the_slack_will_not_cover_them() -> None:
    poor = {"a": ZoneStats(observed_s=168 * H, available_s=30 * H, interruptions=40)}
    assert strategy("gpuopt").decide(situation(stats=poor)).use is Use.ON_DEMAND


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_situation_with_only_the_contract_fields_gets_a_decision(name: str) -> None:
    bare = Situation(
        elapsed_s=0.0,
        deadline_s=52 * H,
        work_left_s=48 * H,
        overhead_s=0.2 * H,
        running=Use.WAIT,
        zone=None,
        spot_now=frozenset({"a"}),
    )
    decision = strategy(name).decide(bare)
    assert decision.use is Use.SPOT and decision.zone == "a" and not decision.at_risk


def test_gpuopt_waits_out_a_young_down_spell_and_rides_on_demand_through_an_old_one() -> None:
    def down_for(hours_down: float) -> Situation:
        seen = ZoneStats(
            observed_s=336 * H, available_s=290 * H, interruptions=60, spell_s=hours_down * H
        )
        # 5.8 h of slack against about 8 h of down spells expected: the slack binds, and
        # each down spell may take its share
        return situation(deadline_s=55 * H, work_left_s=39 * H, stats={"a": seen})

    gpuopt = strategy("gpuopt")
    assert gpuopt.decide(down_for(0.05)).use is Use.WAIT
    assert gpuopt.decide(down_for(3.0)).use is Use.ON_DEMAND
