"""Each policy rule is one object in one ordered list (policies/rulebook.py), and every
consumer reads that list: a rule added through `rulebook.register`, as docs/extending.md
says, is applied by the engine (and by the row engine, its oracle) with its own words, the
other rules keep their verdicts, and a bid cap reaches the backtest, the console's cap line
and the daemon's cap signals without an edit to any of them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from optimizer.daemon.prices import cap_sides, has_bid_cap
from optimizer.model import Market, Offer
from optimizer.ui.prices import bid_cap
from policies import backtest, rulebook
from policies.context import RuleContext
from policies.engine import RULES, Ranking, evaluate
from policies.rule import BidCap, Priced, Shape, ShapeColumns, ShapeRule
from policies.schema import Bid
from tests.helpers import row_engine
from tests.helpers.engine import T0, offer, policy


class NoG5(ShapeRule):
    """A toy rule: no instance of the g5 family."""

    id = "toy.no_g5"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.instance_type.startswith("g5."):
            return f"{shape.instance_type} is in the g5 family"
        return None

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each("instance_type", lambda v: v.startswith("g5."))


class FlatCap(BidCap):
    """A toy bid cap set by no policy key: $30/h for any instance."""

    id = "bid.toy_flat"

    def sets(self, bid: Bid) -> bool:
        return True

    def limit(self, bid: Bid, gpu_count: Any, on_demand: Any) -> Any:
        return 30.0

    def why(self, rules: RuleContext, priced: Priced) -> str | None:
        if priced.usd_per_hour > 30.0:
            return f"${priced.usd_per_hour:g}/h > flat cap $30/h"
        return None


@pytest.fixture
def no_g5() -> Iterator[None]:
    rulebook.register(NoG5(), before="gpu_count")
    try:
        yield
    finally:
        rulebook.unregister(NoG5.id)


@pytest.fixture
def flat_cap() -> Iterator[None]:
    rulebook.register(FlatCap(), before="budget")
    try:
        yield
    finally:
        rulebook.unregister(FlatCap.id)


def g5(**changes: Any) -> Offer:
    return offer(instance_type="g5.48xlarge", **changes)


def same(ours: Ranking, oracle: Ranking) -> None:
    """The engine's answer and the row engine's (its oracle) agree in full."""
    assert list(ours.candidates) == list(oracle.candidates)
    assert [(r.offer, r.rule, r.reason) for r in ours.rejections] == [
        (r.offer, r.rule, r.reason) for r in oracle.rejections
    ]


def verdicts(ranking: Any) -> dict[tuple[str, str], tuple[str, str]]:
    """(instance type, region) → (rule, reason) of each rejection."""
    return {(r.offer.instance_type, r.offer.region): (r.rule, r.reason) for r in ranking.rejections}


def test_the_list_is_the_built_in_rules_in_checking_order() -> None:
    assert tuple(rule.id for rule in rulebook.current()) == RULES
    assert [cap.id for cap in rulebook.bid_caps()] == [r for r in RULES if r.startswith("bid.")]


def test_a_registered_shape_rule_rejects_with_its_words_and_leaves_the_others_alone(
    no_g5: None,
) -> None:
    pol = policy(placement={"regions": {"allow": ["eu-*"]}}, workload={"gpus": 4})
    offers = [
        g5(),  # fails only the toy rule
        g5(region="us-east-1", zone="use1-az1"),  # region comes first
        offer(gpu_count=2),  # gpu_count, after the toy rule: still its own
        g5(gpu_count=2),  # both: the toy rule is checked first
        offer(),  # a candidate
    ]
    ranking = evaluate(pol, offers, T0)
    assert [c.offer for c in ranking.candidates] == [offer()]
    found = verdicts(ranking)
    assert found[("g5.48xlarge", "eu-central-1")] == (
        "toy.no_g5",
        "g5.48xlarge is in the g5 family",
    )
    assert found[("g5.48xlarge", "us-east-1")][0] == "region"
    assert found[("p4de.24xlarge", "eu-central-1")] == ("gpu_count", "2 GPUs < 4 needed")
    assert [r.rule for r in ranking.rejections] == ["region", "toy.no_g5", "toy.no_g5", "gpu_count"]
    assert ranking.rejection_counts()["toy.no_g5"] == 2
    # The row engine runs the rule's scalar check alone: the same answer.
    same(ranking, row_engine.evaluate(pol, offers, T0))


def test_a_rule_registered_after_a_ruleset_was_built_does_not_reach_it() -> None:
    ranking = evaluate(policy(), [g5()], T0)
    assert len(ranking.candidates) == 1
    rulebook.register(NoG5())
    try:
        assert [r.rule for r in evaluate(policy(), [g5()], T0).rejections] == ["toy.no_g5"]
        # Registered without `before`: after the last shape rule.
        ids = [r.id for r in rulebook.current()]
        assert ids.index("toy.no_g5") == ids.index("vcpus") + 1
    finally:
        rulebook.unregister(NoG5.id)
    assert len(evaluate(policy(), [g5()], T0).candidates) == 1


def test_a_registered_bid_cap_reaches_the_engine_backtest_console_and_daemon(
    flat_cap: None,
) -> None:
    plain = policy()  # no bid block: only the toy cap
    spot = offer(market=Market.SPOT, usd_per_hour=35.0)
    cheap = offer(market=Market.SPOT, zone="euc1-az2", usd_per_hour=25.0)
    ranking = evaluate(plain, [spot, cheap], T0)
    [rejection] = ranking.rejections
    assert (rejection.rule, rejection.reason) == ("bid.toy_flat", "$35/h > flat cap $30/h")
    same(ranking, row_engine.evaluate(plain, [spot, cheap], T0))
    # The console's cap line and the daemon's signals read the same list.
    assert bid_cap(plain, 8, None) == 30.0
    assert bid_cap(policy(bid={"max_usd_per_hour": 20}), 8, None) == 20.0
    assert has_bid_cap(plain)
    sides = cap_sides(ranking)
    assert sorted(sides.values()) == [("over", 35.0), ("under", 25.0)]
    # The backtest counts a job pushed off its pool by the cap as a crossing.
    history = backtest.History.from_offers(
        [
            offer(market=Market.SPOT, usd_per_hour=25.0),
            offer(market=Market.SPOT, usd_per_hour=35.0, observed_at=T0 + timedelta(hours=1)),
        ]
    )
    found = backtest.market(plain, history)
    assert found.capped.tolist() == [[False], [True]]
    assert backtest.replay(plain, history).cap_crossings == 1


def test_without_a_registered_cap_a_policy_without_a_bid_block_has_none() -> None:
    assert bid_cap(policy(), 8, 10.0) is None
    assert not has_bid_cap(policy())
    assert (
        bid_cap(policy(bid={"max_usd_per_gpu_hour": 2, "max_fraction_of_on_demand": 0.5}), 8, 30.0)
        == 15.0
    )


def test_a_rule_without_its_mask_cannot_be_built() -> None:
    class WordsOnly(ShapeRule):
        id = "toy.words_only"

        def why(self, rules: RuleContext, shape: Shape) -> str | None:
            return None

    with pytest.raises(TypeError, match="mask"):
        WordsOnly()  # type: ignore[abstract]


def test_a_rule_goes_among_its_level_with_a_fresh_id() -> None:
    with pytest.raises(rulebook.RulebookError, match="ShapeRule: it goes among those"):
        rulebook.register(NoG5(), before="budget")
    with pytest.raises(rulebook.RulebookError, match="already registered"):
        rulebook.register(_Renamed(), before="vcpus")
    with pytest.raises(rulebook.RulebookError, match="no rule 'nope'"):
        rulebook.register(NoG5(), before="nope")
    with pytest.raises(rulebook.RulebookError, match="built in"):
        rulebook.unregister("vcpus")
    assert tuple(rule.id for rule in rulebook.current()) == RULES


class _Renamed(NoG5):
    id = "vcpus"
