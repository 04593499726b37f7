"""The ranking engine: a policy and offers in, ranked candidates and explained rejections out.

`evaluate` is pure: no I/O, and the clock is its `now` argument. Each offer ends up either a
candidate or a rejection carrying the first rule it failed (`policies.rules.RULES` order).

How it stays fast on 100k offers: the rules from `market` to `vcpus` depend only on an offer's
shape (market, place, instance type and its hardware), and a price list repeats each shape
across zones and observations. So one pass looks each shape up in a dict and checks it once;
only the offers whose shape passes go on to the price rules and scoring.

It also leaves the cyclic garbage collector alone (other threads run while it ranks) and
gives it little to do: each container object that outlives a moment counts towards the
collector's next pass, and the older generations' passes walk every live offer. So no record
is built per rejected offer (a rule's rejections are two lists, offers and reasons, made into
`Rejection` records when first read), and nothing per surviving offer but its `Candidate`:
the offers passing are sorted as a list of scores, a fuller key built only where scores tie.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain, compress, groupby, islice, repeat
from operator import eq
from typing import Any, NamedTuple

from optimizer.model import Market, Offer
from policies.budget import Committed
from policies.measured import MEASURED, Measured
from policies.rules import RULES, EvaluationError, Fit, RuleSet
from policies.schema import Policy

__all__ = ["RULES", "Candidate", "EvaluationError", "Ranking", "Rejection", "evaluate"]


def _utc_text(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Candidate(NamedTuple):
    """An offer that passed every rule, with the figures its rank came from.

    A NamedTuple, like Rejection: a permissive policy over a large price list builds one per
    offer, and a frozen dataclass costs several times more to construct.
    """

    offer: Offer
    rank: int  # 1 = best
    score: float  # what rank_by orders on: USD/h, USD per node-TFLOP-hour or per node-TB/s-hour
    usd_per_gpu_hour: float
    gpu_memory_need_gib: float  # per GPU, after the buffer
    memory_headroom: float | None  # offer's GPU memory / need - 1; None when nothing is needed
    node_tflops: float | None  # whole node, for the ranking dtype (measured where known)
    usd_per_tflop_hour: float | None
    on_demand_usd_per_hour: float | None  # cheapest on-demand of the same type in the region
    throughput: str | None = None  # where node_tflops came from: measured | datasheet
    measured_n: int | None = None  # probe results the type's measured figures are medians of
    measured_age_s: float | None = None  # seconds from the newest of them to the evaluation
    node_tbps: float | None = None  # memory bandwidth, whole node (measured where known)
    usd_per_tbps_hour: float | None = None
    bandwidth: str | None = None  # where node_tbps came from: measured | datasheet
    probe_failures: str | None = None  # the type's probes keep failing: ranked after the rest

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
            "throughput": self.throughput,
            "measured_n": self.measured_n,
            "measured_age_s": self.measured_age_s,
            "node_tbps": self.node_tbps,
            "usd_per_tbps_hour": self.usd_per_tbps_hour,
            "bandwidth": self.bandwidth,
            "probe_failures": self.probe_failures,
            "offer": self.offer.to_dict(),
        }


class Rejection(NamedTuple):
    """An offer and the first rule it failed, with a reason that names the numbers.

    A NamedTuple rather than a dataclass: a large price list yields one per offer, and a
    tuple is the cheapest immutable record Python builds. `Ranking` builds them when they
    are first read, not while ranking.
    """

    offer: Offer
    rule: str  # one of RULES
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "reason": self.reason, "offer": self.offer.to_dict()}


# A rule's rejections while evaluate collects them: the offers, and the reason for each.
_Columns = tuple[list[Offer], list[str]]


def _records(rule: str, offers: tuple[Offer, ...], reasons: tuple[str, ...]) -> Iterator[Rejection]:
    """One rule's Rejection records, built as bare tuples (skipping the NamedTuple's
    Python-level __new__)."""
    return map(tuple.__new__, repeat(Rejection), zip(offers, repeat(rule), reasons))


@dataclass(frozen=True, slots=True)
class Ranking:
    """The engine's answer for one policy at one moment.

    Candidates are best first. Rejections are grouped by rule in RULES order and keep the
    input order within a rule; their records are built when first read (`rejections`,
    `rejected(rule)`), so a caller that needs only the best offer or the counts per rule
    (`rejection_counts()`) never pays for one record per rejected offer.
    """

    policy_name: str
    evaluated_at: datetime
    dtype: str  # the dtype throughput and price_per_tflop were read for
    candidates: tuple[Candidate, ...]
    # (rule, offers, reasons) for each rule that rejected something, in RULES order.
    rejected_columns: tuple[tuple[str, tuple[Offer, ...], tuple[str, ...]], ...] = field(repr=False)
    # Records built so far: a rule's, or under "" every rule's.
    _built: dict[str, tuple[Rejection, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    @property
    def rejections(self) -> tuple[Rejection, ...]:
        """Every rejected offer with the first rule it failed, grouped by rule in RULES order."""
        every = self._built.get("")
        if every is None:
            every = tuple(
                chain.from_iterable(
                    self._built.get(rule) or _records(rule, offers, reasons)
                    for rule, offers, reasons in self.rejected_columns
                )
            )
            self._built[""] = every
        return every

    def rejected(self, rule: str) -> tuple[Rejection, ...]:
        """The offers `rule` rejected, in input order."""
        found = self._built.get(rule)
        if found is None:
            every, start, found = self._built.get(""), 0, ()
            for name, offers, reasons in self.rejected_columns:
                if name == rule:
                    stop = start + len(offers)
                    found = every[start:stop] if every else tuple(_records(rule, offers, reasons))
                    break
                start += len(offers)
            self._built[rule] = found
        return found

    def rejection_counts(self) -> dict[str, int]:
        """How many offers each rule rejected, rules in checking order; rules that rejected
        nothing are left out. Builds no records."""
        return {rule: len(offers) for rule, offers, _ in self.rejected_columns}

    def rejections_by_rule(self) -> dict[str, list[Rejection]]:
        """Rejections per rule id, rules in checking order; rules that rejected nothing left out."""
        return {rule: list(self.rejected(rule)) for rule in self.rejection_counts()}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "policy": self.policy_name,
            "evaluated_at": _utc_text(self.evaluated_at),
            "dtype": self.dtype,
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected_by_rule": self.rejection_counts(),
            "rejections": [r.to_dict() for r in self.rejections],
        }


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
) -> Ranking:
    """Rank the offers `policy` allows at `now`, and say why each other offer was rejected.

    `measured` is what the probes measured (`policies.measured.Measured`): per-GPU TFLOPS
    and copy bandwidth per (provider, instance type), with how many results and how old, and
    the types demoted for failing probes; a plain mapping is per-GPU TFLOPS keyed by GPU
    model and dtype. Where a measured figure is present it replaces the hardware table's
    (a type's over a model's). `max_fraction_of_on_demand` compares
    a spot price with the cheapest on-demand price of the same provider, region and instance
    type among `offers` (any zone, any rule outcome except stale).

    `committed` is what the policy has spent this month and the current prices of its live
    attempts (`policies.budget`); the budget rule projects a launch on top of it. None:
    nothing spent, nothing running.
    """
    rules = RuleSet(policy, now, measured, committed)
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
    buckets: dict[str, _Columns] = {rule: ([], []) for rule in RULES}
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
    for offer, shape in zip(kept, kept_shapes, strict=True):
        price = offer.usd_per_hour
        reference = on_demand.get(shape.od_key)
        if check_price:
            verdict = rules.price(
                price, offer.gpu_count, offer.market, reference, offer.instance_type, offer.region
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
        if per_tflop:
            scores.append(usd_per_tflop)  # type: ignore[arg-type]  # the rule ensured a figure
        elif per_tbps:
            scores.append(price / fit.node_tbps)  # type: ignore[union-attr,operator]
        else:
            scores.append(price)
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
