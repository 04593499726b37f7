"""The ranking engine as it was before the columnar one: one offer at a time, in Python.

Kept as the oracle of the property test (tests/test_engine_columnar.py): for any policy and
offers it must give the same candidates in the same order, and the same rule and reason for
every rejection, as `policies.engine.evaluate`. It reads the same `RuleSet`, so what the
test checks is the columnar engine's masks, order and figures against these loops.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from itertools import compress, groupby, islice
from operator import eq
from typing import Any

from optimizer.model import Market, Offer
from policies.budget import Committed
from policies.egress import StatePlace
from policies.measured import MEASURED, Measured
from policies.ranking import Candidate, Ranking
from policies.rules import Fit, RuleSet
from policies.schema import Policy

# A rule's rejections while evaluate collects them: the offers, and the reason for each.
_Columns = tuple[list[Offer], list[str]]


class _Shape:
    """One distinct offer shape: its verdict under the shape rules, memoized for the pass."""

    __slots__ = ("explain", "fit", "od_key", "od_min", "on_demand", "reason", "reject", "rule")

    def __init__(self, rules: RuleSet, key: tuple[Any, ...], buckets: dict[str, _Columns]):
        # The key is (market, provider, region, instance_type, gpu_model, gpu_count,
        # gpu_memory_gib, interconnect, vcpus, ram_gib, fabric): everything the shape rules
        # read.
        market, provider, region, instance_type, *hardware = key
        verdict = rules.shape(market, provider, region, instance_type, *hardware)
        self.rule: str | None = None
        self.reason = ""
        self.fit: Fit | None = None
        if isinstance(verdict, Fit):
            self.fit = verdict
        else:
            self.rule, self.reason = verdict
            offers, reasons = buckets[self.rule]
            self.reject, self.explain = offers.append, reasons.append
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
        offer.fabric.value,
        offer.fabric_interfaces,
        -1 if offer.term_years is None else offer.term_years,
        "" if offer.payment_option is None else offer.payment_option.value,
        -1.0 if offer.upfront_usd is None else offer.upfront_usd,
    )


def _order(
    scores: list[float], offers: list[Offer], markets: Mapping[str, int], demoted: list[bool]
) -> list[int]:
    """Indexes in rank order: by (score, market preference, provider, region, zone, type),
    then indexes that tie on all of it by every other field of their offers; the demoted
    (their type's probes keep failing) after all the others, in the same order among them.

    Sorted on the score alone first, a float per offer: the rest of the key is built only
    for offers whose score ties (an equal price in another zone, say), not for every offer.
    """

    def rest(i: int) -> tuple[Any, ...]:
        offer = offers[i]
        return (
            markets[offer.market],
            offer.provider,
            offer.region,
            offer.zone or "",
            offer.instance_type,
        )

    def every_field(i: int) -> tuple[Any, ...]:
        return _fallback(offers[i])

    order = sorted(range(len(scores)), key=scores.__getitem__)
    for start, stop in _ties(order, scores.__getitem__):
        run = sorted(order[start:stop], key=rest)
        for first, end in _ties(run, rest):
            run[first:end] = sorted(run[first:end], key=every_field)
        order[start:stop] = run
    if any(demoted):
        order = [i for i in order if not demoted[i]] + [i for i in order if demoted[i]]
    return order


def _ties(order: list[int], key: Any) -> Iterator[tuple[int, int]]:
    """(start, stop) of each run of two or more equal keys in `order`, which is sorted by
    `key`. Ties are rare: one C-level pass finds them instead of a Python loop."""
    values = list(map(key, order))
    tied = compress(range(1, len(values)), map(eq, values, islice(values, 1, None)))
    for _, run in groupby(tied, key=values.__getitem__):
        ends = list(run)
        yield ends[0] - 1, ends[-1] + 1


def _first_pass(
    rules: RuleSet, offers: Iterable[Offer], buckets: dict[str, _Columns]
) -> tuple[list[_Shape], list[Offer], list[_Shape]]:
    """Reject stale offers and offers whose shape fails a rule (into `buckets`); return the
    shapes seen, each with its cheapest on-demand price, and the offers left to price with
    their shapes (two lists, index for index)."""
    shapes: dict[tuple[Any, ...], _Shape] = {}
    kept: list[Offer] = []
    kept_shapes: list[_Shape] = []
    # The hot loop, with locals only. Memory traffic dominates at this size, so everything an
    # offer needs happens while it is in cache: one visit each. The key is spelled out field by
    # field (reads on a slots class beat an attrgetter twofold). Nothing outlives the loop
    # but list entries: the key is dropped at once (a collector pass counts only objects that
    # stay), a rejection is its offer and reason appended to its rule's two lists.
    oldest, newest, stale = rules.oldest, rules.newest, rules.stale
    stale_offers, stale_reasons = buckets["stale"]
    reject_stale, explain_stale = stale_offers.append, stale_reasons.append
    keep, keep_shape = kept.append, kept_shapes.append
    for offer in offers:
        observed = offer.observed_at
        if observed < oldest or observed > newest:
            reject_stale(offer)
            explain_stale(stale(observed))
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
            offer.fabric,
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
            keep(offer)
            keep_shape(shape)
        else:
            shape.reject(offer)
            shape.explain(shape.reason)
    return list(shapes.values()), kept, kept_shapes


def evaluate(
    policy: Policy,
    offers: Iterable[Offer],
    now: datetime,
    *,
    measured: Measured | Mapping[str, Mapping[str, float]] | None = None,
    committed: Committed | None = None,
    state: StatePlace | None = None,
) -> Ranking:
    """`policies.engine.evaluate`, one offer at a time (same arguments, same answer)."""
    rules = RuleSet(policy, now, measured, committed, state)
    return _rank(rules, policy.name, offers)


def _candidate(
    now: datetime,
    offer: Offer,
    rank: int,
    score: float,
    need: float,
    fit: Fit,
    usd_per_tflop: float | None,
    reference: float | None,
) -> Candidate:
    """A candidate with where its figures came from (probes or the datasheet)."""
    found = fit.measurement
    used = found is not None and MEASURED in (fit.throughput, fit.bandwidth)
    tbps = fit.node_tbps
    return Candidate(
        offer,
        rank,
        score,
        offer.usd_per_hour / offer.gpu_count,
        need,
        fit.memory_headroom,
        fit.node_tflops,
        usd_per_tflop,
        reference,
        fit.throughput,
        found.n if used else None,  # type: ignore[union-attr]
        (now - found.newest_at).total_seconds() if used else None,  # type: ignore[union-attr]
        tbps,
        offer.usd_per_hour / tbps if tbps else None,
        fit.bandwidth,
        fit.probe_failures,
    )


def _rank(rules: RuleSet, policy_name: str, offers: Iterable[Offer]) -> Ranking:
    buckets: dict[str, _Columns] = {rule: ([], []) for rule in rules.ids}
    shapes, kept, kept_shapes = _first_pass(rules, offers, buckets)
    on_demand = _on_demand_prices(shapes)
    markets, per_tflop, per_tbps = rules.markets, rules.per_tflop, rules.per_tbps
    check_price = rules.prices_capped
    # The offers that pass, in columns (index for index) rather than a record each.
    passed: list[Offer] = []
    scores: list[float] = []
    references: list[float | None] = []
    per_tflops: list[float | None] = []
    fits: list[Fit] = []
    moves: list[float] = []
    for offer, shape in zip(kept, kept_shapes, strict=True):
        price = offer.usd_per_hour
        reference = on_demand.get(shape.od_key)
        if check_price:
            verdict = rules.price(
                price,
                offer.gpu_count,
                offer.market,
                reference,
                offer.instance_type,
                offer.region,
                offer.provider,
            )
            if verdict is not None:
                rule, reason = verdict
                rejected, reasons = buckets[rule]
                rejected.append(offer)
                reasons.append(reason)
                continue
        fit = shape.fit
        node = fit.node_tflops  # type: ignore[union-attr]  # a shape without a rule has a Fit
        usd_per_tflop = price / node if node else None
        ranked = price
        if rules.state is not None:  # data gravity: the move, spread over the horizon
            move = rules.state.move(offer.provider, offer.region, price)
            moves.append(move.total_usd)
            ranked = price + move.total_usd / rules.state.horizon_hours
        if per_tflop:
            scores.append(ranked / node)  # type: ignore[operator]  # the rule ensured a figure
        elif per_tbps:
            scores.append(ranked / fit.node_tbps)  # type: ignore[union-attr,operator]
        else:
            scores.append(ranked)
        passed.append(offer)
        references.append(reference)
        per_tflops.append(usd_per_tflop)
        fits.append(fit)  # type: ignore[arg-type]

    need = rules.memory_need
    demoted = [f.probe_failures is not None for f in fits]
    candidates = tuple(
        _candidate(
            rules.now, passed[i], rank, scores[i], need, fits[i], per_tflops[i], references[i]
        )
        for rank, i in enumerate(_order(scores, passed, markets, demoted), 1)
    )
    if rules.state is not None:
        state, by_offer = rules.state, dict(zip(map(id, passed), moves, strict=True))
        candidates = tuple(
            c._replace(
                move_usd=by_offer[id(c.offer)],
                move_usd_per_hour=by_offer[id(c.offer)] / state.horizon_hours,
                move=state.explain(
                    state.move(c.offer.provider, c.offer.region, c.offer.usd_per_hour)
                ),
            )
            for c in candidates
        )
    return Ranking(
        policy_name=policy_name,
        evaluated_at=rules.now,
        dtype=rules.dtype,
        candidates=candidates,
        rejected_columns=tuple(
            (rule, tuple(offers), tuple(reasons))
            for rule, (offers, reasons) in buckets.items()
            if offers
        ),
    )
