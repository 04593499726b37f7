"""Every rule's mask over an `OfferTable`, and the first failing rule per row.

The rules are the `RuleSet`'s (`policies.rulebook`'s list, less those the policy does not
set), each one object whose `mask` is its verdict on many offers at once. The shape rules
read only a row's shape (`policies.table.SHAPE_FIELDS`), and a price list repeats each shape
across zones and observations: they run over one row per shape, and the verdict reaches every
row through its shape id. `stale` and the price rules (`bid.*`, `budget`) run over every row.
Each level stacks its masks in checking order and takes the first failing rule of each row in
one pass (`_first`).

Only verdicts come out of here, as rule indexes into `RuleSet.checks`. A reason is formatted
when it is read, by the failing rule's own `why` (`Verdicts.reason`), so it reads exactly as
the rule words it; the property test (tests/test_engine_columnar.py) holds each mask to its
`why`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

from optimizer.model import Market
from policies.measured import DATASHEET, MEASURED, TypeMeasurement
from policies.price_rules import STALE
from policies.rule import Priced, Prices, Shape, ShapeColumns
from policies.rules import RuleSet
from policies.table import SHAPE_FIELDS, OfferTable

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np

PASSED = -1  # the rule index of a row that fails no rule
_shape_of = attrgetter(*SHAPE_FIELDS)


def _first(masks: Sequence[np.ndarray], indexes: Sequence[int], size: int) -> np.ndarray:
    """Per row, the index (from `indexes`, one per mask) of the first mask that is True, PASSED
    where none is."""
    if not masks:
        return np.full(size, PASSED, dtype=np.int16)
    stacked = np.stack(masks)
    first = np.asarray(indexes, dtype=np.int16)[stacked.argmax(axis=0)]
    return np.where(stacked.any(axis=0), first, np.int16(PASSED))


@dataclass(slots=True)
class Shapes:
    """One row per distinct shape, and what the shape rules make of it."""

    rows: np.ndarray  # each shape's first row in the table
    ids: np.ndarray  # per table row: its shape
    rule: np.ndarray  # per shape: index of its first failing rule, or PASSED
    node_tflops: np.ndarray  # per shape, rank dtype; NaN where there is no figure
    throughput: np.ndarray  # per shape: measured | datasheet | None
    node_tbps: np.ndarray  # per shape; NaN where there is no figure
    bandwidth: np.ndarray  # per shape: measured | datasheet | None
    measurement: np.ndarray  # per shape: TypeMeasurement | None
    probe_failures: np.ndarray  # per shape: str | None
    demoted: np.ndarray  # per shape: probe_failures is not None


@dataclass(slots=True)
class Verdicts:
    """The engine's per-row answer: the first failing rule, and what the price rules read."""

    table: OfferTable
    rules: RuleSet
    shapes: Shapes
    rule: np.ndarray  # per row: index into rules.checks, or PASSED
    on_demand: np.ndarray  # per row: cheapest on-demand of its (provider, region, type); NaN
    _reasons: dict[int, str] = field(default_factory=dict)

    def reason(self, row: int) -> str:
        """Why `row` was rejected, in the failing rule's words (formatted now)."""
        index = int(self.rule[row])
        rules = self.rules
        offer = self.table.offers[row]
        why: str | None = None
        price_rule = rules.price_at.get(index)
        if price_rule is not None:
            reference = float(self.on_demand[row])
            priced = Priced(
                offer.usd_per_hour,
                offer.gpu_count,
                offer.market,
                None if np.isnan(reference) else reference,
                offer.instance_type,
                offer.region,
                offer.provider,
            )
            why = price_rule.why(rules, priced)
        elif index == rules.stale_index:
            why = STALE.why(rules, offer.observed_at)
        else:
            shape = int(self.shapes.ids[row])
            why = self._reasons.get(shape)
            if why is None:
                values = Shape._make(_shape_of(offer))
                why = rules.shape_at[index].why(rules, values)
                if why is not None:
                    self._reasons[shape] = why
        if why is None:
            raise AssertionError(f"row {row}: the masks say {rules.ids[index]}, its check passes")
        return why

    def reasons(self, rows: np.ndarray) -> list[str]:
        """`reason` of each row, each distinct reason formatted once: a shape rule's per
        shape, stale's per observation time; the price rules' per row."""
        if len(rows) == 0:
            return []
        index = int(self.rule[rows[0]])
        if index in self.rules.price_at or np.any(self.rule[rows] != index):
            return list(map(self.reason, rows.tolist()))
        stale = index == self.rules.stale_index
        by = self.table.column("observed_at").codes if stale else self.shapes.ids
        _, first, inverse = np.unique(by[rows], return_index=True, return_inverse=True)
        words = np.array([self.reason(int(rows[i])) for i in first], dtype=object)
        return words[inverse.reshape(-1)].tolist()  # type: ignore[no-any-return]


def shapes(rules: RuleSet, table: OfferTable) -> Shapes:
    """The shape rules over one row per shape (module docstring)."""
    columns = ShapeColumns(rules, table)
    masks = [rule.mask(rules, columns) for _, rule in rules.shape_checks]
    indexes = [i for i, _ in rules.shape_checks]
    count = columns.number("gpu_count")
    rank_figure, rank_measured = columns.figure(rules.dtype)
    bandwidth, bandwidth_measured = columns.bandwidth()

    none = np.full(columns.size, None, dtype=object)
    measurement, demoted = none, none
    if rules.measured_types or rules.demoted:
        pair = ("provider", "instance_type")
        found, failed = rules.measured_types.get, rules.demoted.get
        measurement = columns.each_group(pair, lambda p, k: found((p, k)), object)
        demoted = columns.each_group(pair, lambda p, k: failed((p, k)), object)
    has_figure = ~np.isnan(rank_figure)
    has_bandwidth = ~np.isnan(bandwidth)
    return Shapes(
        rows=columns.rows,
        ids=columns.ids,
        rule=_first(masks, indexes, columns.size),
        node_tflops=count * rank_figure,
        throughput=_sources(has_figure, rank_measured),
        node_tbps=count * bandwidth / 1000,
        bandwidth=_sources(has_bandwidth, bandwidth_measured),
        measurement=measurement,
        probe_failures=demoted,
        demoted=np.array([d is not None for d in demoted.tolist()], dtype=bool),
    )


def _sources(present: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Per shape: `measured`, `datasheet`, or None where there is no figure."""
    out = np.full(len(present), None, dtype=object)
    out[present & measured] = MEASURED
    out[present & ~measured] = DATASHEET
    return out


def _on_demand(rules: RuleSet, table: OfferTable, fresh: np.ndarray) -> np.ndarray:
    """Per row: the cheapest fresh on-demand USD/h of its (provider, region, instance type),
    any zone and any rule outcome but stale; NaN where there is none."""
    ids, first = table.group(("provider", "region", "instance_type"))
    market = table.column("market")
    on_demand = market.codes == market.code_of(Market.ON_DEMAND)
    chosen = on_demand & fresh
    cheapest = np.full(len(first), np.inf)
    np.minimum.at(cheapest, ids[chosen], table.number("usd_per_hour")[chosen])
    cheapest[np.isinf(cheapest)] = np.nan
    return cheapest[ids]  # type: ignore[no-any-return]


def places(table: OfferTable, rows: np.ndarray) -> tuple[list[tuple[str, str]], np.ndarray]:
    """The distinct (provider, region) pairs of `rows`, and each row's index into them."""
    provider, region = table.column("provider"), table.column("region")
    key = provider.codes[rows].astype(np.int64) * max(len(region.values), 1) + region.codes[rows]
    unique, index = np.unique(key, return_inverse=True)
    width = max(len(region.values), 1)
    pairs = [(provider.values[k // width], region.values[k % width]) for k in unique.tolist()]
    return pairs, index.reshape(-1)


def judge(rules: RuleSet, table: OfferTable) -> Verdicts:
    """The first failing rule of every row (module docstring)."""
    stale = STALE.mask(rules, table)
    found = shapes(rules, table)
    on_demand = _on_demand(rules, table, ~stale)
    rule = np.where(stale, np.int16(rules.stale_index), found.rule[found.ids])
    pending = np.flatnonzero(rule == PASSED)  # the price rules judge only these rows
    if rules.price_checks:
        market = table.column("market")
        prices = Prices(
            usd_per_hour=table.number("usd_per_hour")[pending],
            gpu_count=table.number("gpu_count")[pending],
            spot=market.codes[pending] == market.code_of(Market.SPOT),
            on_demand=on_demand[pending],
            hours_left=lambda: rules.budget_hours,
            places=lambda: places(table, pending),
        )
        masks = [check.mask(rules, prices) for _, check in rules.price_checks]
        indexes = [i for i, _ in rules.price_checks]
        rule[pending] = _first(masks, indexes, len(pending))
    return Verdicts(table, rules, found, rule, on_demand)


def measurement_used(measurement: TypeMeasurement | None, *sources: str | None) -> bool:
    """Whether a candidate's figures came from its type's probes (it then reports n, age)."""
    return measurement is not None and MEASURED in sources
