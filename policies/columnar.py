"""Every rule as a vectorised mask over an `OfferTable`, and the first failing rule per row.

The rules from `market` to `vcpus` read only a row's shape (`policies.table.SHAPE_FIELDS`),
and a price list repeats each shape across zones and observations: they run over one row per
shape, and the verdict reaches every row through its shape id. `stale` and the price rules
(`bid.*`, `budget`) run over every row. Each level stacks its masks in `RULES` order and
takes the first failing rule of each row in one pass (`_first`).

Only verdicts come out of here, as rule indexes. A reason is formatted when it is read, by
the same `RuleSet` methods the rules are written in (`reason`), so it reads exactly as the
scalar rule words it; the property test (tests/test_engine_columnar.py) holds the masks to
those methods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimizer.model import Interconnect, Market
from policies import budget
from policies.measured import DATASHEET, MEASURED, TypeMeasurement
from policies.rules import _SLACK, RULES, RuleSet, Verdict, fabric_meets
from policies.table import SHAPE_FIELDS, OfferTable

PASSED = -1  # the rule index of a row that fails no rule
_INDEX = {rule: i for i, rule in enumerate(RULES)}
_SHAPE_RULES = RULES[1 : RULES.index("vcpus") + 1]  # market .. vcpus
_PRICE_RULES = RULES[RULES.index("vcpus") + 1 :]  # bid.* and budget
assert RULES[0] == "stale" and _SHAPE_RULES[0] == "market", "RULES order changed"


def _first(masks: Sequence[np.ndarray], offset: int, size: int) -> np.ndarray:
    """Index (offset + k) of the first mask that is True per row, PASSED where none is."""
    if not masks:
        return np.full(size, PASSED, dtype=np.int16)
    stacked = np.stack(masks)
    first = stacked.argmax(axis=0).astype(np.int16) + offset
    return np.where(stacked.any(axis=0), first, np.int16(PASSED))


@dataclass(frozen=True, slots=True)
class _Groups:
    """Distinct combinations of some columns over one row per shape: `ids` per shape, and
    `first`, the first shape of each combination. Depends on the table only."""

    ids: np.ndarray
    first: np.ndarray

    def spread(self, values: Sequence[Any] | np.ndarray, dtype: Any = None) -> np.ndarray:
        """Per shape, the value computed for its combination."""
        return np.asarray(values, dtype=dtype)[self.ids]


def _groups(table: OfferTable, names: tuple[str, ...]) -> _Groups:
    def build() -> _Groups:
        rows = table.shape_ids()[1]
        key = np.zeros(len(rows), dtype=np.int64)
        for name in names:
            column = table.column(name)
            key = key * max(len(column.values), 1) + column.codes[rows]
        _, first, ids = np.unique(key, return_index=True, return_inverse=True)
        return _Groups(ids.reshape(-1), first)

    return table.memo("shape-groups:" + ",".join(names), build)  # type: ignore[no-any-return]


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
    rule: np.ndarray  # per row: index into RULES, or PASSED
    on_demand: np.ndarray  # per row: cheapest on-demand of its (provider, region, type); NaN
    _reasons: dict[int, str] = field(default_factory=dict)

    def reason(self, row: int) -> str:
        """Why `row` was rejected, in the scalar rule's words (formatted now)."""
        rule = RULES[int(self.rule[row])]
        offer = self.table.offers[row]
        if rule == "stale":
            return self.rules.stale(offer.observed_at)
        if rule in _PRICE_RULES:
            reference = float(self.on_demand[row])
            verdict: Verdict | Any = self.rules.price(
                offer.usd_per_hour,
                offer.gpu_count,
                offer.market,
                None if np.isnan(reference) else reference,
                offer.instance_type,
                offer.region,
            )
        else:
            shape = int(self.shapes.ids[row])
            found = self._reasons.get(shape)
            if found is not None:
                return found
            verdict = self.rules.shape(*(getattr(offer, name) for name in SHAPE_FIELDS))
            if isinstance(verdict, tuple):
                self._reasons[shape] = verdict[1]
        if not isinstance(verdict, tuple) or verdict[0] != rule:
            raise AssertionError(f"row {row}: masks say {rule}, the rule says {verdict!r}")
        return str(verdict[1])

    def reasons(self, rows: np.ndarray) -> list[str]:
        """`reason` of each row, each distinct reason formatted once: a shape rule's per
        shape, stale's per observation time; the price rules' per row."""
        if len(rows) == 0:
            return []
        rule = RULES[int(self.rule[rows[0]])]
        if rule in _PRICE_RULES or np.any(self.rule[rows] != self.rule[rows[0]]):
            return list(map(self.reason, rows.tolist()))
        by = self.table.column("observed_at").codes if rule == "stale" else self.shapes.ids
        _, first, inverse = np.unique(by[rows], return_index=True, return_inverse=True)
        words = np.array([self.reason(int(rows[i])) for i in first], dtype=object)
        return words[inverse.reshape(-1)].tolist()  # type: ignore[no-any-return]


def _lookup(table: OfferTable, name: str, rows: np.ndarray, fn: Callable[[Any], Any]) -> Any:
    """`fn` of the named column's value at `rows`, computed once per distinct value."""
    column = table.column(name)
    return np.asarray([fn(v) for v in column.values])[column.codes[rows]]


def _nan(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def shapes(rules: RuleSet, table: OfferTable) -> Shapes:
    """The shape rules over one row per shape (module docstring)."""
    ids, rows = table.shape_ids()
    count = table.number("gpu_count")[rows]
    memory = table.number("gpu_memory_gib")[rows]
    m = len(rows)
    nothing = np.zeros(m, dtype=bool)
    column = table.column

    def value(name: str, shape: int) -> Any:
        return column(name).values[column(name).codes[rows[shape]]]

    masks: list[np.ndarray] = [
        ~_lookup(table, "market", rows, lambda v: v in rules.markets),
        ~_lookup(table, "provider", rows, lambda v: v in rules.providers),
    ]
    place = _groups(table, ("provider", "region"))
    verdicts = [
        rules._place(value("provider", i), value("region", i)) for i in place.first.tolist()
    ]
    rule = place.spread([v[0] if v else "" for v in verdicts], dtype=object)
    masks += [rule == "region", rule == "compliance"]
    if rules.gpu_models:
        masks.append(~_lookup(table, "gpu_model", rows, lambda v: v in rules.gpu_models))
    else:
        masks.append(nothing)
    masks.append(count < rules.gpus)
    masks.append(memory < rules.memory_need * (1 - _SLACK))
    if rules.fp64:
        masks.append(_lookup(table, "gpu_model", rows, lambda v: rules._no_fp64(v) is not None))
    else:
        masks.append(nothing)
    if rules.nvlink:
        other = _lookup(table, "interconnect", rows, lambda v: v != Interconnect.NVLINK)
        masks.append(other & (count > 1))
    else:
        masks.append(nothing)
    if rules.fabric != "any":
        masks.append(_lookup(table, "fabric", rows, lambda v: not fabric_meets(v, rules.fabric)))
    else:
        masks.append(nothing)

    # Figures per (provider, type, model): a type's probes can differ from its model's table
    # row. Without per-type measurements they depend on the model alone.
    per_type = bool(rules.measured_types)
    by = ("provider", "instance_type", "gpu_model") if per_type else ("gpu_model",)
    kinds = _groups(table, by)
    keys = [
        (value("gpu_model", i), value("provider", i), value("instance_type", i))
        for i in kinds.first.tolist()
    ]

    def figure(dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """(per-GPU TFLOPS or NaN, measured?) per shape."""
        found = [rules.figure(model, dtype, provider, kind) for model, provider, kind in keys]
        return kinds.spread(_nan([f[0] for f in found])), kinds.spread(
            [f[1] == MEASURED for f in found], dtype=bool
        )

    slow = nothing
    for dtype, (_raw, need) in rules.min_tflops.items():
        per_gpu, _ = figure(dtype)
        with np.errstate(invalid="ignore"):
            slow = slow | np.isnan(per_gpu) | (count * per_gpu < need * (1 - _SLACK))
    rank_figure, rank_measured = figure(rules.dtype)
    copies = [rules.bandwidth(model, provider, kind) for model, provider, kind in keys]
    bandwidth = kinds.spread(_nan([c[0] for c in copies]))
    bandwidth_measured = kinds.spread([c[1] == MEASURED for c in copies], dtype=bool)
    if rules.per_tflop:
        slow = slow | np.isnan(rank_figure)
    if rules.per_tbps:
        slow = slow | np.isnan(bandwidth)
    masks.append(slow)
    masks.append(table.number("ram_gib")[rows] < rules.cpu_memory * (1 - _SLACK))
    masks.append(table.number("vcpus")[rows] < rules.vcpus)

    none = np.full(m, None, dtype=object)
    measurement, demoted = none, none
    if rules.measured_types or rules.demoted:
        types = _groups(table, ("provider", "instance_type"))
        pairs = [(value("provider", i), value("instance_type", i)) for i in types.first.tolist()]
        measurement = types.spread([rules.measured_types.get(p) for p in pairs], object)
        demoted = types.spread([rules.demoted.get(p) for p in pairs], object)
    has_figure = ~np.isnan(rank_figure)
    has_bandwidth = ~np.isnan(bandwidth)
    return Shapes(
        rows=rows,
        ids=ids,
        rule=_first(masks, _INDEX["market"], m),
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


def judge(rules: RuleSet, table: OfferTable) -> Verdicts:
    """The first failing rule of every row (module docstring)."""
    observed = table.column("observed_at")
    stale = observed.map(lambda v: v < rules.oldest or v > rules.newest, dtype=bool)
    found = shapes(rules, table)
    on_demand = _on_demand(rules, table, ~stale)
    rule = np.where(stale, np.int16(_INDEX["stale"]), found.rule[found.ids])
    pending = np.flatnonzero(rule == PASSED)  # the price rules judge only these rows
    masks = _price_masks(rules, table, pending, on_demand[pending])
    rule[pending] = _first(masks, _INDEX[_PRICE_RULES[0]], len(pending))
    return Verdicts(table, rules, found, rule, on_demand)


def _price_masks(
    rules: RuleSet, table: OfferTable, rows: np.ndarray, on_demand: np.ndarray
) -> list[np.ndarray]:
    """bid.max_usd_per_hour .. budget over `rows` (the caller keeps each row's first)."""
    if not rules.prices_capped:
        return []
    price = table.number("usd_per_hour")[rows]
    count = table.number("gpu_count")[rows]
    none = np.zeros(len(price), dtype=bool)
    masks = [none, none, none, none]
    if rules.max_usd_per_hour is not None:
        masks[0] = price > rules.max_usd_per_hour * (1 + _SLACK)
    if rules.max_usd_per_gpu_hour is not None:
        masks[1] = price > rules.max_usd_per_gpu_hour * count * (1 + _SLACK)
    if rules.max_fraction is not None:
        market = table.column("market")
        spot = market.codes[rows] == market.code_of(Market.SPOT)
        missing = np.isnan(on_demand)
        with np.errstate(invalid="ignore"):
            over = price > rules.max_fraction * on_demand * (1 + _SLACK)
        masks[2] = spot & (missing | over)
    if rules.monthly_usd is not None:
        spend = rules.committed
        hours = budget.hours_left(rules.now, rules.hours_per_month)
        monthly = spend.spent_usd + (spend.live_usd_per_hour + price * rules.nodes) * hours
        masks[3] = monthly > rules.monthly_usd * (1 + _SLACK)
    return masks


def measurement_used(measurement: TypeMeasurement | None, *sources: str | None) -> bool:
    """Whether a candidate's figures came from its type's probes (it then reports n, age)."""
    return measurement is not None and MEASURED in sources
