"""The ranking engine: a policy and offers in, ranked candidates and explained rejections out.

`evaluate` is pure: no I/O, and the clock is its `now` argument. Each offer ends up either a
candidate or a rejection carrying the first rule it failed, in the checking order of
`policies.rulebook` (`RULES`: the built-in rules).

It works on columns (`policies.table.OfferTable`): every rule is a vectorised mask, and the
first failing rule of each offer comes from one pass over the stacked masks
(`policies.columnar`). A caller that ranks several policies over the same offers (the daemon,
after each poll) builds the table once and passes it; given plain offers, `evaluate` builds
one. Candidates are sorted on their scores with numpy, the full tie-break key read only for
offers whose scores tie. A rejection's offer and reason are produced when first read.

The engine this replaced checked one offer at a time; it is kept as the property test's oracle
(tests/helpers/row_engine.py), which holds this one to the same candidates, order, rules and
reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from itertools import repeat
from typing import TYPE_CHECKING, Any

from optimizer.model import Market, Offer
from policies.budget import Committed
from policies.columnar import PASSED, Verdicts, judge, places
from policies.data_rules import move_parts
from policies.egress import StatePlace
from policies.measured import MEASURED, Measured
from policies.ranking import Candidate, LazyRows, Ranking, Rejection
from policies.rules import RULES, EvaluationError, RuleSet
from policies.schema import Policy
from policies.table import OfferTable

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np

__all__ = [
    "RULES",
    "Candidate",
    "EvaluationError",
    "OfferTable",
    "Ranking",
    "Rejection",
    "evaluate",
]


def evaluate(
    policy: Policy,
    offers: OfferTable | Iterable[Offer],
    now: datetime,
    *,
    measured: Measured | Mapping[str, Mapping[str, float]] | None = None,
    committed: Committed | None = None,
    state: StatePlace | None = None,
) -> Ranking:
    """Rank the offers `policy` allows at `now`, and say why each other offer was rejected.

    `offers` is an `OfferTable` (built once, ranked under many policies) or any iterable of
    `Offer` (a table is built from it; a list is read in place, not copied, so leave it
    unchanged while the ranking is read).

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

    `state` is where the job being launched keeps its state (its checkpoint) and how big it
    is: each candidate's price for ranking then grows by the cost of moving the state to it,
    spread over `state.horizon_hours`, and the `data.*` rules apply (policies/data_rules.py).
    None (no job, or a job without state): the ranking is as if `data` were not there.
    """
    rules = RuleSet(policy, now, measured, committed, state)
    table = offers if isinstance(offers, OfferTable) else OfferTable.from_offers(offers)
    if len(table) == 0:
        return Ranking(policy.name, rules.now, rules.dtype, (), ())
    verdicts = judge(rules, table)
    return Ranking(
        policy_name=policy.name,
        evaluated_at=rules.now,
        dtype=rules.dtype,
        candidates=_candidates(verdicts),
        rejected_columns=_rejected(verdicts),
    )


def _rejected(verdicts: Verdicts) -> tuple[tuple[str, LazyRows[Offer], LazyRows[str]], ...]:
    """Each rule's rejected rows in input order, their offers and reasons read lazily."""
    rule = verdicts.rule
    rejected = np.flatnonzero(rule != PASSED)
    order = rejected[np.argsort(rule[rejected], kind="stable")]
    ids = verdicts.rules.ids
    counts = np.bincount(rule[rejected], minlength=len(ids))
    offers = verdicts.table.offers.__getitem__
    out = []
    start = 0
    for index, count in enumerate(counts.tolist()):
        if count:
            rows = order[start : start + count]
            out.append(
                (
                    ids[index],
                    LazyRows(offers, rows),
                    LazyRows(verdicts.reason, rows, verdicts.reasons),
                )
            )
            start += count
    return tuple(out)


def _nan_none(values: np.ndarray) -> list[float | None]:
    return [None if v != v else v for v in values.tolist()]


def _candidates(verdicts: Verdicts) -> Sequence[Candidate]:
    """The passing rows, best first, with the figures their ranks came from; each record is
    built when read (the sort is the work, a record per row the reader's choice)."""
    table, rules, shapes = verdicts.table, verdicts.rules, verdicts.shapes
    rows = np.flatnonzero(verdicts.rule == PASSED)
    if len(rows) == 0:
        return ()
    price = table.number("usd_per_hour")[rows]
    node = shapes.node_tflops
    tbps = shapes.node_tbps
    moves = None
    if rules.state is not None:
        # Data gravity: the move of the job's state, spread over its horizon, on the price.
        egress, seconds = move_parts(rules, *places(table, rows))
        moves = egress + seconds * price / 3600
        price = price + moves / rules.state.horizon_hours
    if rules.per_tflop:
        scores = price / node[shapes.ids[rows]]
    elif rules.per_step:  # per TFLOP, an offer without a figure after the rest
        mine = node[shapes.ids[rows]]
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = np.where(mine > 0, price / mine, np.inf)
    elif rules.per_tbps:
        scores = price / tbps[shapes.ids[rows]]
    else:
        scores = price
    demoted = shapes.demoted[shapes.ids[rows]]
    order = _order(verdicts, rows, scores, demoted)
    ranked, scores = rows[order], scores[order]
    if moves is not None:
        moves = moves[order]

    def build(positions: np.ndarray) -> list[Candidate]:
        records = _records(verdicts, ranked[positions], positions, scores[positions])
        if moves is None:
            return records
        return _with_moves(verdicts, records, moves[positions])

    def one(position: int) -> Candidate:
        return build(np.array([position]))[0]

    return LazyRows(one, np.arange(len(ranked)), build)


def _with_moves(verdicts: Verdicts, records: list[Candidate], moves: np.ndarray) -> list[Candidate]:
    """The records with the move of the job's state to each, in USD, per hour of the
    horizon, and in words."""
    state = verdicts.rules.state
    assert state is not None
    out = []
    for record, move in zip(records, moves.tolist(), strict=True):
        offer = record.offer
        cost = state.move(offer.provider, offer.region, offer.usd_per_hour)
        out.append(
            record._replace(
                move_usd=move,
                move_usd_per_hour=move / state.horizon_hours,
                move=state.explain(cost),
            )
        )
    return out


def _records(
    verdicts: Verdicts, rows: np.ndarray, positions: np.ndarray, scores: np.ndarray
) -> list[Candidate]:
    """Candidate records for `rows`, ranked at `positions` (0 = best)."""
    table, rules, shapes = verdicts.table, verdicts.rules, verdicts.shapes
    shape = shapes.ids[rows]
    price = table.number("usd_per_hour")[rows]
    count = table.number("gpu_count")[rows]
    node = shapes.node_tflops[shape]
    tbps = shapes.node_tbps[shape]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_tflop = np.where(node > 0, price / node, np.nan)
        per_tbps = np.where(tbps > 0, price / tbps, np.nan)
    need = rules.memory_need
    memory = table.number("gpu_memory_gib")[rows]
    headroom: Iterable[float | None] = (memory / need - 1).tolist() if need else repeat(None)
    measurement = shapes.measurement[shape].tolist()
    throughput = shapes.throughput[shape].tolist()
    bandwidth = shapes.bandwidth[shape].tolist()
    ns: list[int | None] = []
    ages: list[float | None] = []
    for found, source, copy in zip(measurement, throughput, bandwidth, strict=True):
        used = found is not None and MEASURED in (source, copy)
        ns.append(found.n if used else None)
        ages.append((rules.now - found.newest_at).total_seconds() if used else None)
    columns = (
        map(table.offers.__getitem__, rows.tolist()),
        (positions + 1).tolist(),
        scores.tolist(),
        (price / count).tolist(),
        repeat(need),
        headroom,
        _nan_none(node),
        _nan_none(per_tflop),
        _nan_none(verdicts.on_demand[rows]),
        throughput,
        ns,
        ages,
        _nan_none(tbps),
        _nan_none(per_tbps),
        bandwidth,
        shapes.probe_failures[shape].tolist(),
    )
    # Fields the engine does not fill (the expected cost, worked out outside it) take their
    # defaults: built as bare tuples, the records get no defaults of their own.
    rest = Candidate._fields[len(columns) :]
    filled = (*columns, *(repeat(Candidate._field_defaults[name]) for name in rest))
    return list(map(tuple.__new__, repeat(Candidate), zip(*filled)))  # noqa: B905


def _order(
    verdicts: Verdicts, rows: np.ndarray, scores: np.ndarray, demoted: np.ndarray
) -> np.ndarray:
    """Positions into `rows` in rank order: by (score, market preference, provider, region,
    zone, type), then by every other field of their offers, then input order; owned offers
    first where the policy lists `owned` first (`_owned_first`); the demoted
    (their type's probes keep failing) after all the others, in the same order among them.

    One sort on the score; the rest of the key is built only for rows whose scores tie (an
    equal price in another zone, say)."""
    order = np.argsort(scores)
    ordered = scores[order]
    tied = ordered[1:] == ordered[:-1]
    if tied.any():
        in_run = np.zeros(len(order), dtype=bool)
        in_run[1:] |= tied
        in_run[:-1] |= tied
        run = np.cumsum(np.concatenate(([True], ~tied)))
        positions = np.flatnonzero(in_run)
        picked = rows[order[positions]]
        keys = [*_tie_keys(verdicts, picked), picked]  # then input order
        resorted = np.lexsort([*reversed(keys), run[positions]])  # last key sorts first
        order[positions] = order[positions][resorted]
    owned = _owned_first(verdicts, rows)
    if owned is not None and owned.any():
        first = owned[order]
        order = np.concatenate((order[first], order[~first]))
    if demoted.any():
        ranked = demoted[order]
        order = np.concatenate((order[~ranked], order[ranked]))
    return order


def _owned_first(verdicts: Verdicts, rows: np.ndarray) -> np.ndarray | None:
    """Per row, whether it is an owned offer that ranks ahead of every cloud offer: the
    policy lists `owned` before each of its other markets ("own first, then spot"); None
    where it does not (owned offers then rank by price, the market order breaking ties)."""
    markets = verdicts.rules.markets
    place = markets.get(Market.OWNED)
    if place is None or any(i < place for i in markets.values()):
        return None
    market = verdicts.table.column("market")
    code = market.code_of(Market.OWNED)
    if code < 0:
        return None
    return market.codes[rows] == code  # type: ignore[no-any-return]


def _tie_keys(verdicts: Verdicts, rows: np.ndarray) -> list[np.ndarray]:
    """The tie-break key of `rows`, most significant first, as numbers that sort alike."""
    table, markets = verdicts.table, verdicts.rules.markets
    market = table.column("market")

    def rank(name: str, key: Callable[[Any], Any] | None = None) -> np.ndarray:
        column = table.column(name)
        ranks = table.memo(f"ranks:{name}", lambda: column.value_ranks(key))
        return ranks[column.codes[rows]]  # type: ignore[no-any-return]

    def number(name: str) -> np.ndarray:
        return table.number(name)[rows]

    return [
        np.array([markets.get(m, len(markets)) for m in market.values])[market.codes[rows]],
        rank("provider"),
        rank("region"),
        rank("zone", lambda v: v or ""),
        rank("instance_type"),
        number("usd_per_hour"),
        rank("observed_at"),
        rank("gpu_model"),
        number("gpu_count"),
        number("gpu_memory_gib"),
        number("vcpus"),
        number("ram_gib"),
        rank("interconnect", lambda v: v.value),
        rank("placement_score", lambda v: -1.0 if v is None else v),
        rank("interruption_bucket", lambda v: v or ""),
        rank("source"),
        rank("fabric", lambda v: v.value),
        number("fabric_interfaces"),
        rank("term_years", lambda v: -1 if v is None else v),
        rank("payment_option", lambda v: "" if v is None else v.value),
        rank("upfront_usd", lambda v: -1.0 if v is None else v),
    ]
