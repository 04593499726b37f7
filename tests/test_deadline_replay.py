"""The tick replay to the cent on hand-made traces, the optimum against brute force, and the
properties every strategy keeps (never below the optimum, never a feasible deadline missed,
more slack never costs the optimum more)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.deadline import (
    STRATEGIES,
    DeadlineStrategy,
    Decision,
    Situation,
    Trace,
    Use,
    optimum,
    replay,
    strategy,
)

Action = tuple[Use, str | None]


class Script(DeadlineStrategy):
    """Plays a fixed list of actions, one per tick (the last one repeated)."""

    name = "script"

    def __init__(self, actions: Sequence[Action]) -> None:
        self.actions = list(actions)
        self.seen: list[Situation] = []

    def decide(self, s: Situation) -> Decision:
        self.seen.append(s)
        use, zone = self.actions[min(len(self.seen) - 1, len(self.actions) - 1)]
        return Decision(use=use, zone=zone, reason="scripted")


def trace(zone: str, counts: Sequence[int], gap: float = 600) -> Trace:
    return Trace(name=f"{zone}_v100_1.json", zone=zone, gap_s=gap, counts=tuple(counts))


# 10-minute ticks: up, up, down, down, up, up, up, up
HAND = trace("a", [1, 1, 0, 0, 1, 1, 1, 1])
JOB = dict(
    start_tick=0,
    work_s=1800,
    deadline_s=3600,
    overhead_s=300,
    spot_price=0.9,
    on_demand_price=3.0,
)


def test_greedy_to_the_cent_spot_then_on_demand_for_good() -> None:
    # t=0 and 600: spot (300 s start-up, 900 s of work); preempted at 1200, slack
    # 3600-1200-900-300 = 1200 s >= 300+600: wait; at 1800 slack 600 s: on-demand, 300 s
    # start-up and 900 s of work, done at 3000. Spot 1200 s x $0.9/h, on-demand 1200 s x $3/h.
    out = replay(strategy("greedy"), [HAND], **JOB)  # type: ignore[arg-type]
    assert round(out.cost_usd, 2) == 1.30
    assert round(out.on_demand_cost_usd, 2) == 1.75  # (1800 + 300) s x $3/h
    assert (out.deadline_met, out.finish_s, out.restarts) == (True, 3000.0, 1)
    assert (out.spot_hours, out.on_demand_hours) == (pytest.approx(1 / 3), pytest.approx(1 / 3))


def test_the_optimum_to_the_cent_waits_for_spot_to_come_back() -> None:
    # spot at ticks 0-1 (300 + 900 s) and 4-5 (300 + 900 s): 2400 s x $0.9/h, done at 3600
    assert round(optimum([HAND], **JOB), 2) == 0.60  # type: ignore[arg-type]


def test_a_preemption_during_the_start_up_loses_only_that_time() -> None:
    line = trace("a", [1, 0, 1, 1, 1, 1])
    play = Script([(Use.SPOT, "a"), (Use.WAIT, None), (Use.SPOT, "a")])
    out = replay(
        play, [line], start_tick=0, work_s=600, deadline_s=3600, overhead_s=900,
        spot_price=3.6, on_demand_price=10.0,
    )  # fmt: skip
    # 600 s of start-up lost at tick 0; the second start pays 900 s, then 600 s of work:
    # done at 1200 + 900 + 600 = 2700; billed 600 + 1500 = 2100 s at $3.6/h
    assert out.finish_s == 2700.0 and round(out.cost_usd, 2) == 2.10 and out.restarts == 1
    assert play.seen[1].running is Use.WAIT  # the strategy is told of the preemption
    assert play.seen[3].work_left_s == 600 + 300  # the start-up still to pay counts as work


def test_nodes_multiply_the_bill_and_a_move_between_zones_is_a_restart() -> None:
    a, b = trace("a", [2, 2, 0, 0]), trace("b", [0, 3, 2, 2])
    play = Script([(Use.SPOT, "a"), (Use.SPOT, "a"), (Use.SPOT, "b")])
    out = replay(
        play, [a, b], start_tick=0, work_s=1200, deadline_s=2400, overhead_s=60,
        spot_price=1.0, on_demand_price=3.0, nodes=2,
    )  # fmt: skip
    # a: 60 s start-up + 1140 s of work; b: 60 s start-up + 60 s of work, done at 1320
    assert out.finish_s == 1320.0 and out.restarts == 1
    assert round(out.cost_usd, 4) == round((1200 + 120) * 1.0 * 2 / 3600, 4)
    three = replay(
        Script([(Use.SPOT, "a")]), [a, b], start_tick=0, work_s=1200, deadline_s=2400,
        overhead_s=60, spot_price=1.0, on_demand_price=3.0, nodes=3,
    )  # fmt: skip
    assert three.spot_hours == 0 and not three.deadline_met  # 2 instances are not 3 nodes


def test_an_infeasible_deadline_has_no_optimum_and_is_missed() -> None:
    job = dict(JOB, deadline_s=2000)  # 1800 s of work + 300 s start-up > 2000 s
    assert optimum([HAND], **job) is None  # type: ignore[arg-type]
    out = replay(strategy("gpuopt"), [HAND], **job)  # type: ignore[arg-type]
    assert not out.deadline_met and out.finish_s is None


def brute_force(traces: list[Trace], job: dict[str, float]) -> float | None:
    """Every action at every tick, replayed."""
    actions: list[Action] = [(Use.WAIT, None), (Use.ON_DEMAND, None)]
    actions += [(Use.SPOT, t.zone) for t in traces]
    ticks = -(-int(job["deadline_s"]) // int(traces[0].gap_s))
    best = None
    for plan in itertools.product(actions, repeat=ticks):
        out = replay(Script(plan), traces, **job)  # type: ignore[arg-type]
        if out.deadline_met and (best is None or out.cost_usd < best):
            best = out.cost_usd
    return best


def test_the_optimum_equals_brute_force_on_tiny_traces() -> None:
    draw = random.Random(30)
    for _ in range(40):
        zones = draw.choice([1, 1, 2])
        gap = draw.choice([10, 20, 30])
        traces = [
            trace(f"z{i}", [draw.choice([0, 1, 1]) for _ in range(8)], gap) for i in range(zones)
        ]
        ticks = draw.choice([3, 4])
        job = dict(
            start_tick=draw.choice([0, 1, 2]),
            work_s=draw.choice([10, 20, 30, 45, 50]),
            deadline_s=draw.choice([ticks * gap, ticks * gap - 5]),
            overhead_s=draw.choice([0, 5, 10, 15, 25]),
            spot_price=draw.choice([0.3, 0.5, 1.0]),
            on_demand_price=1.0,
        )
        expected = brute_force(traces, job)
        got = optimum(traces, **job)  # type: ignore[arg-type]
        assert (got is None) == (expected is None), (traces, job)
        if expected is not None:
            assert got == pytest.approx(expected, abs=1e-9), (traces, job)


@st.composite
def jobs(draw: st.DrawFn) -> tuple[list[Trace], dict[str, float]]:
    gap = draw(st.sampled_from([60, 120, 300]))
    zones = draw(st.integers(1, 3))
    length = draw(st.integers(4, 60))
    traces = [
        trace(f"z{i}", draw(st.lists(st.integers(0, 2), min_size=length, max_size=length)), gap)
        for i in range(zones)
    ]
    work = draw(st.integers(1, 40)) * 60
    overhead = draw(st.sampled_from([0, 60, 180, 300, 600]))
    deadline = work + overhead + draw(st.integers(0, 60)) * 60
    job = dict(
        start_tick=draw(st.integers(0, length - 1)),
        work_s=work,
        deadline_s=deadline,
        overhead_s=overhead,
        spot_price=draw(st.sampled_from([0.2, 0.918, 1.5])),
        on_demand_price=3.06,
        nodes=draw(st.sampled_from([1, 2])),
    )
    return traces, job


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_no_strategy_misses_a_feasible_deadline_or_costs_less_than_the_optimum(
    case: tuple[list[Trace], dict[str, float]],
) -> None:
    traces, job = case
    best = optimum(traces, **job)  # type: ignore[arg-type]
    assert best is not None  # work + one start-up fits: on-demand from the start does
    for name in STRATEGIES:
        out = replay(strategy(name), traces, **job)  # type: ignore[arg-type]
        assert out.deadline_met, name
        assert out.cost_usd >= best - 1e-9, name
        assert out.cost_usd <= out.on_demand_cost_usd * 3  # bounded by restarts, not unbounded


@settings(max_examples=40, deadline=None)
@given(jobs(), st.integers(1, 30))
def test_more_slack_never_makes_the_optimum_cost_more(
    case: tuple[list[Trace], dict[str, float]], more_minutes: int
) -> None:
    traces, job = case
    tight = optimum(traces, **job)  # type: ignore[arg-type]
    loose = optimum(traces, **dict(job, deadline_s=job["deadline_s"] + more_minutes * 60))  # type: ignore[arg-type]
    assert tight is not None and loose is not None and loose <= tight + 1e-9


def test_the_replay_shows_each_zone_its_history_and_spell_age() -> None:
    from policies.deadline.replay import zone_stats

    line = trace("a", [1, 1, 0, 0, 0, 1, 1, 0])
    seen = zone_stats([line], 5)["a"]  # ticks 0-4 watched; up again since tick 5
    assert (seen.observed_s, seen.available_s, seen.interruptions) == (3000, 1200, 1)
    assert seen.spell_s == 0
    assert zone_stats([line], 4)["a"].spell_s == 1200  # down since tick 2
