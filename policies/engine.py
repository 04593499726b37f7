"""The ranking engine: a policy and offers in, ranked candidates and explained rejections out.

`evaluate` is pure: no I/O, and the clock is its `now` argument. Each offer ends up either a
candidate or a rejection carrying the first rule it failed (`policies.rules.RULES` order).

How it stays fast on 100k offers: the rules from `market` to `vcpus` depend only on an offer's
shape (market, place, instance type and its hardware), and a price list repeats each shape
across zones and observations. So one pass looks each shape up in a dict and checks it once;
only the offers whose shape passes go on to the price rules and scoring.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain, compress, groupby, islice
from operator import eq, itemgetter
from typing import Any, NamedTuple

from optimizer.model import Market, Offer
from policies.rules import RULES, EvaluationError, Fit, RuleSet
from policies.schema import Policy

__all__ = ["RULES", "Candidate", "EvaluationError", "Ranking", "Rejection", "evaluate"]

_RULE_INDEX = {rule: i for i, rule in enumerate(RULES)}


def _utc_text(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Candidate(NamedTuple):
    """An offer that passed every rule, with the figures its rank came from.

    A NamedTuple, like Rejection: a permissive policy over a large price list builds one per
    offer, and a frozen dataclass costs several times more to construct.
    """

    offer: Offer
    rank: int  # 1 = best
    score: float  # what rank_by orders on: USD/h, or USD per node-TFLOP-hour
    usd_per_gpu_hour: float
    gpu_memory_need_gib: float  # per GPU, after the buffer
    memory_headroom: float | None  # offer's GPU memory / need - 1; None when nothing is needed
    node_tflops: float | None  # whole node, for the ranking dtype (measured where known)
    usd_per_tflop_hour: float | None
    on_demand_usd_per_hour: float | None  # cheapest on-demand of the same type in the region

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "score": self.score,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "gpu_memory_need_gib": self.gpu_memory_need_gib,
            "memory_headroom": self.memory_headroom,
            "node_tflops": self.node_tflops,
            "usd_per_tflop_hour": self.usd_per_tflop_hour,
            "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
            "offer": self.offer.to_dict(),
        }


class Rejection(NamedTuple):
    """An offer and the first rule it failed, with a reason that names the numbers.

    A NamedTuple rather than a dataclass: a large price list yields one per offer, and a
    tuple is the cheapest immutable record Python builds.
    """

    offer: Offer
    rule: str  # one of RULES
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "reason": self.reason, "offer": self.offer.to_dict()}


@dataclass(frozen=True, slots=True)
class Ranking:
    """The engine's answer for one policy at one moment.

    Candidates are best first. Rejections are grouped by rule in RULES order and keep the
    input order within a rule.
    """

    policy_name: str
    evaluated_at: datetime
    dtype: str  # the dtype throughput and price_per_tflop were read for
    candidates: tuple[Candidate, ...]
    rejections: tuple[Rejection, ...]

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def rejections_by_rule(self) -> dict[str, list[Rejection]]:
        """Rejections per rule id, rules in checking order; rules that rejected nothing left out."""
        grouped: dict[str, list[Rejection]] = {}
        for rejection in self.rejections:
            grouped.setdefault(rejection.rule, []).append(rejection)
        order = sorted(grouped, key=lambda rule: _RULE_INDEX.get(rule, len(RULES)))
        return {rule: grouped[rule] for rule in order}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "policy": self.policy_name,
            "evaluated_at": _utc_text(self.evaluated_at),
            "dtype": self.dtype,
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected_by_rule": {r: len(v) for r, v in self.rejections_by_rule().items()},
            "rejections": [r.to_dict() for r in self.rejections],
        }


class _Shape:
    """One distinct offer shape: its verdict under the shape rules, memoized for the pass."""

    __slots__ = ("fit", "od_key", "od_min", "on_demand", "reason", "reject", "rule")

    def __init__(self, rules: RuleSet, key: tuple[Any, ...], buckets: dict[str, list[Any]]):
        # The key is (market, provider, region, instance_type, gpu_model, gpu_count,
        # gpu_memory_gib, interconnect, vcpus, ram_gib): everything the shape rules read.
        market, provider, region, instance_type, *hardware = key
        verdict = rules.shape(market, provider, region, *hardware)
        self.rule: str | None = None
        self.reason = ""
        self.fit: Fit | None = None
        if isinstance(verdict, Fit):
            self.fit = verdict
        else:
            self.rule, self.reason = verdict
            self.reject = buckets[self.rule].append
        self.on_demand = market == Market.ON_DEMAND
        self.od_key = (provider, region, instance_type)
        self.od_min = math.inf  # the cheapest fresh offer of this shape, on-demand shapes only


def _on_demand_prices(shapes: Iterable[_Shape]) -> dict[tuple[str, str, str], float]:
    """Cheapest on-demand USD/h per (provider, region, instance type), over every zone."""
    prices: dict[tuple[str, str, str], float] = {}
    for shape in shapes:
        if shape.on_demand and shape.od_min < prices.get(shape.od_key, math.inf):
            prices[shape.od_key] = shape.od_min
    return prices


def _fallback(offer: Offer) -> tuple[Any, ...]:
    """Every other field, so offers that tie on the documented tiebreak still sort one way."""
    return (
        offer.usd_per_hour,
        offer.observed_at,
        offer.gpu_model,
        offer.gpu_count,
        offer.gpu_memory_gib,
        offer.vcpus,
        offer.ram_gib,
        offer.interconnect.value,
        -1.0 if offer.placement_score is None else offer.placement_score,
        offer.interruption_bucket or "",
        offer.source,
    )


def _sorted(scored: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Order (key, offer, ...) items by key, then items with equal keys by every other field
    of their offers. The key is (score, market preference, provider, region, zone, type)."""
    scored.sort(key=itemgetter(0))
    keys = list(map(itemgetter(0), scored))
    # Exact ties are rare: find them with one C-level pass instead of a Python loop.
    tied = compress(range(1, len(keys)), map(eq, keys, islice(keys, 1, None)))
    for _, run in groupby(tied, key=lambda end: keys[end]):
        ends = list(run)
        start, stop = ends[0] - 1, ends[-1] + 1
        scored[start:stop] = sorted(scored[start:stop], key=lambda i: _fallback(i[1]))
    return scored


def _first_pass(
    rules: RuleSet, offers: Iterable[Offer], buckets: dict[str, list[Rejection]]
) -> tuple[list[_Shape], list[tuple[Offer, _Shape]]]:
    """Reject stale offers and offers whose shape fails a rule (into `buckets`); return the
    shapes seen, each with its cheapest on-demand price, and the offers left to price."""
    shapes: dict[tuple[Any, ...], _Shape] = {}
    survivors: list[tuple[Offer, _Shape]] = []
    # The hot loop, with locals only. Memory traffic dominates at this size, so everything an
    # offer needs happens while it is in cache: one visit each. The key is spelled out field by
    # field (reads on a slots class beat an attrgetter twofold), and a Rejection is built as a
    # bare tuple, skipping the NamedTuple's Python-level __new__.
    new = tuple.__new__
    oldest, newest, stale = rules.oldest, rules.newest, rules.stale
    reject_stale = buckets["stale"].append
    survive = survivors.append
    for offer in offers:
        observed = offer.observed_at
        if observed < oldest or observed > newest:
            reject_stale(new(Rejection, (offer, "stale", stale(observed))))
            continue
        key = (
            offer.market,
            offer.provider,
            offer.region,
            offer.instance_type,
            offer.gpu_model,
            offer.gpu_count,
            offer.gpu_memory_gib,
            offer.interconnect,
            offer.vcpus,
            offer.ram_gib,
        )
        try:
            shape = shapes[key]
        except KeyError:
            shape = shapes[key] = _Shape(rules, key, buckets)
        if shape.on_demand:
            price = offer.usd_per_hour
            if price < shape.od_min:
                shape.od_min = price
        if shape.rule is None:
            survive((offer, shape))
        else:
            shape.reject(new(Rejection, (offer, shape.rule, shape.reason)))
    return list(shapes.values()), survivors


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while the pass allocates a record per offer.

    The records form no cycles, yet every 700 allocations start a collection, and the older
    generations' collections walk every live offer: on the 100k-offer bench, 115 ms became
    70 ms. The previous state is restored on the way out.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def evaluate(
    policy: Policy,
    offers: Iterable[Offer],
    now: datetime,
    *,
    measured: Mapping[str, Mapping[str, float]] | None = None,
) -> Ranking:
    """Rank the offers `policy` allows at `now`, and say why each other offer was rejected.

    `measured` holds per-GPU TFLOPS keyed by GPU model and dtype (from the probes); where a
    figure is present it replaces the hardware table's. `max_fraction_of_on_demand` compares
    a spot price with the cheapest on-demand price of the same provider, region and instance
    type among `offers` (any zone, any rule outcome except stale).
    """
    rules = RuleSet(policy, now, measured)
    with _collector_paused():
        return _rank(rules, policy.name, offers)


def _rank(rules: RuleSet, policy_name: str, offers: Iterable[Offer]) -> Ranking:
    buckets: dict[str, list[Rejection]] = {rule: [] for rule in RULES}
    shapes, survivors = _first_pass(rules, offers, buckets)
    on_demand = _on_demand_prices(shapes)
    markets, per_tflop, check_price = rules.markets, rules.per_tflop, rules.prices_capped
    scored: list[tuple[Any, ...]] = []
    for offer, shape in survivors:
        price = offer.usd_per_hour
        reference = on_demand.get(shape.od_key)
        if check_price:
            verdict = rules.price(
                price, offer.gpu_count, offer.market, reference, offer.instance_type, offer.region
            )
            if verdict is not None:
                buckets[verdict[0]].append(Rejection(offer, *verdict))
                continue
        fit = shape.fit
        node = fit.node_tflops  # type: ignore[union-attr]  # a shape without a rule has a Fit
        usd_per_tflop = price / node if node else None
        key = (
            usd_per_tflop if per_tflop else price,
            markets[offer.market],
            offer.provider,
            offer.region,
            offer.zone or "",
            offer.instance_type,
        )
        scored.append((key, offer, reference, usd_per_tflop, fit))

    need = rules.memory_need
    candidates = tuple(
        # Positional, in field order: keyword arguments cost more across 100k candidates.
        Candidate(
            offer,
            rank,
            key[0],
            offer.usd_per_hour / offer.gpu_count,
            need,
            fit.memory_headroom,
            fit.node_tflops,
            usd_per_tflop,
            reference,
        )
        for rank, (key, offer, reference, usd_per_tflop, fit) in enumerate(_sorted(scored), 1)
    )
    return Ranking(
        policy_name=policy_name,
        evaluated_at=rules.now,
        dtype=rules.dtype,
        candidates=candidates,
        rejections=tuple(chain.from_iterable(buckets.values())),
    )
