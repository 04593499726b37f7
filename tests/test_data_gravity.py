"""Data gravity in the ranking (policies/data_rules.py, policies/engine.py): a job's state
place adds the move to each offer's price for ranking, the `data:` rules reject with their
reasons, the row engine agrees, and a ranking without state is exactly as before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import ValidationError

from optimizer.jobs.ranking import horizon_hours, state_place
from optimizer.model import Market
from policies import risk, rulebook
from policies.egress import StatePlace
from policies.engine import RULES, Ranking, evaluate
from policies.schema import Policy
from tests.helpers import row_engine
from tests.helpers.engine import T0, offer, policy

GIB = 2**30

ACROSS = offer(provider="gcp", region="us-central1", zone="us-central1-a", usd_per_hour=10.0)
"""Cheaper, but an ocean and a cloud away from the checkpoint."""
BESIDE = offer(provider="aws", region="eu-central-1", zone="euc1-az1", usd_per_hour=10.5)
"""Dearer, in the checkpoint's own region."""
BIG = StatePlace("aws", "eu-central-1", 5 * 10**11)  # 500 GB, nothing measured, a day ahead


def same(ours: Ranking, oracle: Ranking) -> None:
    assert list(ours.candidates) == list(oracle.candidates)
    assert [(r.offer, r.rule, r.reason) for r in ours.rejections] == [
        (r.offer, r.rule, r.reason) for r in oracle.rejections
    ]
    assert ours.to_dict() == oracle.to_dict()


def test_the_data_rules_are_in_the_rulebook_in_order() -> None:
    ids = [r.id for r in rulebook.current()]
    assert ids == list(RULES)
    assert ids.index("data.regions") == ids.index("compliance") + 1
    assert ids.index("data.max_move_usd") == ids.index("budget") - 1


def test_a_cheap_offer_across_the_ocean_from_a_big_checkpoint_ranks_below_one_beside_it() -> None:
    plain = evaluate(policy(), [ACROSS, BESIDE], T0)
    assert [c.offer for c in plain.candidates] == [ACROSS, BESIDE]

    ranked = evaluate(policy(), [ACROSS, BESIDE], T0, state=BIG)
    assert [c.offer for c in ranked.candidates] == [BESIDE, ACROSS]
    beside, across = ranked.candidates
    # Beside: same region, no egress; 5e11 B at one 5 Gbps flow (625 MB/s) = 800 s at
    # $10.5/h = $2.3333, over 24 h = $0.09722/h.
    assert beside.move_usd == pytest.approx(800 * 10.5 / 3600)
    assert beside.score == pytest.approx(10.5 + 800 * 10.5 / 3600 / 24)
    # Across: AWS to the internet, 500 GB x $0.09 = $45; the flow halved between regions,
    # 1600 s at $10/h = $4.4444; $49.4444 over 24 h = $2.0602/h.
    assert across.move_usd == pytest.approx(45 + 1600 * 10 / 3600)
    assert across.move_usd_per_hour == pytest.approx((45 + 1600 * 10 / 3600) / 24)
    assert across.score == pytest.approx(12.06019, abs=1e-5)
    assert across.move == (
        "moving 465.7 GiB from aws eu-central-1: $45.00 egress + 1600 s restore ($4.44)"
    )
    assert across.to_dict()["move_usd"] == across.move_usd
    same(ranked, row_engine.evaluate(policy(), [ACROSS, BESIDE], T0, state=BIG))


def test_a_longer_horizon_spreads_the_move_thinner_and_the_cheap_offer_wins_again() -> None:
    # Over 1000 h the move adds $0.0494/h across and $0.0023/h beside: 10.049 < 10.502.
    long = StatePlace("aws", "eu-central-1", 5 * 10**11, horizon_hours=1000)
    ranked = evaluate(policy(), [ACROSS, BESIDE], T0, state=long)
    assert [c.offer for c in ranked.candidates] == [ACROSS, BESIDE]


def test_expected_cost_adds_the_move_per_hour_too() -> None:
    ranked = evaluate(policy(), [ACROSS, BESIDE], T0, state=BIG)
    reordered = risk.by_expected_cost(reversed(list(ranked.candidates)))
    assert [c.offer for c in reordered] == [BESIDE, ACROSS]


def test_max_move_usd_rejects_an_offer_whose_move_costs_more_with_its_numbers() -> None:
    # 12.3 GiB at 300 MiB/s: 13.207 GB x $0.09 = $1.19 to GCP, 42 s at $10/h = $0.12.
    state = StatePlace("aws", "eu-central-1", int(12.3 * GIB), restore_mib_s=300.0)
    limited = policy(data={"max_move_usd": 1.0})
    ranked = evaluate(limited, [ACROSS, BESIDE], T0, state=state)
    assert [c.offer for c in ranked.candidates] == [BESIDE]
    (rejected,) = ranked.rejections
    assert (rejected.offer, rejected.rule) == (ACROSS, "data.max_move_usd")
    assert rejected.reason == (
        "moving the checkpoint (12.3 GiB, aws eu-central-1 → gcp us-central1) costs $1.31 "
        "($1.19 egress + 42 s restore), over data.max_move_usd $1.00"
    )
    same(ranked, row_engine.evaluate(limited, [ACROSS, BESIDE], T0, state=state))


def test_the_restore_time_alone_can_be_over_the_limit() -> None:
    # Same region, no egress: 5e11 B in 800 s on a $100/h instance is $22.22 > $20.
    dear = offer(usd_per_hour=100.0)
    ranked = evaluate(policy(data={"max_move_usd": 20}), [dear], T0, state=BIG)
    assert [r.rule for r in ranked.rejections] == ["data.max_move_usd"]
    assert "costs $22.22 ($0.00 egress + 800 s restore)" in ranked.rejections[0].reason


def test_data_regions_allow_rejects_other_regions_but_never_the_checkpoints_own() -> None:
    us = offer(region="us-east-1", zone="use1-az1", usd_per_hour=5.0)
    europe = offer(provider="gcp", region="europe-west4", zone="europe-west4-a")
    home = offer(region="eu-central-1")  # the checkpoint's own: moves nothing
    fenced = policy(data={"regions": {"allow": ["us-*"]}})
    state = StatePlace("aws", "eu-central-1", 10**9)
    ranked = evaluate(fenced, [us, europe, home], T0, state=state)
    assert [c.offer for c in ranked.candidates] == [us, home]
    (rejected,) = ranked.rejections
    assert (rejected.offer, rejected.rule) == (europe, "data.regions")
    assert rejected.reason == (
        "region europe-west4 is not in data.regions.allow (us-*): "
        "the job's checkpoint is in aws eu-central-1"
    )
    same(ranked, row_engine.evaluate(fenced, [us, europe, home], T0, state=state))


def test_without_state_the_data_rules_pass_everything_and_the_ranking_is_unchanged() -> None:
    offers = [ACROSS, BESIDE, offer(region="us-east-1", market=Market.SPOT, usd_per_hour=3.0)]
    strict = policy(data={"max_move_usd": 0, "regions": {"allow": ["ap-northeast-1"]}})
    ours = evaluate(strict, offers, T0)
    before = evaluate(policy(), offers, T0)
    assert ours.to_dict() | {"policy": "x"} == before.to_dict() | {"policy": "x"}
    assert ours.rejections == ()
    assert all(c.move_usd is None and "move_usd" not in c.to_dict() for c in ours.candidates)


def test_the_data_block_is_validated() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        policy(data={"max_move_usd": -1})
    with pytest.raises(ValidationError, match="less than or equal to 1000000000"):
        policy(data={"max_move_usd": 1e12})
    with pytest.raises(ValidationError, match="not a region glob"):
        policy(data={"regions": {"allow": ["eu west"]}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        policy(data={"max_move": 1})
    loaded = policy(data={"max_move_usd": None, "regions": {"allow": ["eu-*"]}})
    assert loaded.data.max_move_usd is None and loaded.data.regions.allow == ["eu-*"]
    assert Policy.model_validate(loaded.model_dump(by_alias=True)) == loaded


def test_the_horizon_is_what_is_left_of_max_duration_else_a_day() -> None:
    assert horizon_hours(None, 5 * 3600) == 24.0
    assert horizon_hours(72 * 3600, 10 * 3600) == 62.0
    assert horizon_hours(2 * 3600, 5 * 3600) == 1.0  # at least an hour


@dataclass
class Checkpoint:
    provider: str | None
    region: str | None
    size_bytes: int


def test_a_state_place_comes_from_the_newest_checkpoint_when_its_place_is_known() -> None:
    found = state_place(Checkpoint("gcp", "europe-west4", 7), restore_mib_s=250.0)
    assert found == StatePlace("gcp", "europe-west4", 7, 250.0, 24.0)
    assert state_place(None) is None
    assert state_place(Checkpoint(None, "x", 1)) is None
    kept: Any = state_place(Checkpoint("aws", "us-east-1", 1), max_duration_s=7200, ran_s=3600)
    assert kept.horizon_hours == 1.0


def test_the_offers_table_shows_the_move_beside_each_candidate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from optimizer.cli.ranking_view import RankingView
    from optimizer.cli.render import ranking_table

    ranked = evaluate(policy(), [ACROSS, BESIDE], T0, state=BIG)
    ranking_table(RankingView.of(ranked), limit=0, explain=False, source="test")
    out = capsys.readouterr().out
    assert "move $/h" in out and "2.0602" in out and "0.0972" in out
    assert "moving 465.7 GiB" in out and "$45.00 egress" in out  # (the cell may wrap)
    ranking_table(
        RankingView.of(evaluate(policy(), [ACROSS], T0)), limit=0, explain=False, source="t"
    )
    assert "move" not in capsys.readouterr().out
