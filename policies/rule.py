"""What a policy rule is: one object with its check on one offer (which words the reason)
and its check on columns (which gives the engine's and the backtest's verdicts).

A rule belongs to one of three levels, by what it reads, and `policies.rulebook` keeps them
in that order: `stale` (the observation time), then the shape rules (`ShapeRule`: only the
offer's shape, `policies.table.SHAPE_FIELDS`, so they run once per shape), then the price
rules (`PriceRule`: the price, its on-demand reference and the policy's spend). A bid cap
(`BidCap`) is a price rule that says the highest price it allows; the console's cap line and
the daemon's cap signals read that (`policies.rulebook.bid_cap`).

`why` and `mask` must agree: `mask` is True exactly where `why` returns a reason. The
property test (tests/test_engine_columnar.py) holds them to each other over random policies
and offers, with the row engine (tests/helpers/row_engine.py) running `why` alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from optimizer.model import Fabric, Interconnect, Market
from policies.context import SLACK, RuleContext
from policies.measured import MEASURED
from policies.schema import Bid
from policies.table import OfferTable

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np


class Shape(NamedTuple):
    """One offer's shape, as a shape rule's `why` reads it (`policies.table.SHAPE_FIELDS`)."""

    market: Market
    provider: str
    region: str
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gib: float
    interconnect: Interconnect
    vcpus: int
    ram_gib: float
    fabric: Fabric = Fabric.NONE


class Priced(NamedTuple):
    """One offer's price, as a price rule's `why` reads it."""

    usd_per_hour: float
    gpu_count: int
    market: Market
    on_demand: float | None  # cheapest fresh on-demand of its (provider, region, type)
    instance_type: str
    region: str
    provider: str = ""


def _nan(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


class ShapeColumns:
    """A table's shapes, one row each (its first row in the table), as a shape rule's `mask`
    reads them: each helper computes a value once per distinct value (or combination) and
    spreads it to every shape that has it."""

    def __init__(self, rules: RuleContext, table: OfferTable) -> None:
        self.rules = rules
        self.table = table
        self.ids, self.rows = table.shape_ids()
        self.size = len(self.rows)
        self._figures: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._bandwidth: tuple[np.ndarray, np.ndarray] | None = None
        self._kinds: tuple[np.ndarray, list[tuple[Any, ...]]] | None = None

    def number(self, name: str) -> np.ndarray:
        """An int or float field, per shape."""
        return self.table.shape_number(name)

    def each(self, name: str, fn: Callable[[Any], Any], dtype: Any = bool) -> np.ndarray:
        """`fn` of the named field, per shape, called once per distinct value."""
        column = self.table.shape_column(name)
        return np.asarray([fn(v) for v in column.values], dtype=dtype)[column.codes]

    def each_group(
        self, names: tuple[str, ...], fn: Callable[..., Any], dtype: Any = bool
    ) -> np.ndarray:
        """`fn(*values)` of the named fields, per shape, called once per distinct combination."""
        ids, first = self._groups(names)
        values = [self._values(names, int(i)) for i in first.tolist()]
        return np.asarray([fn(*v) for v in values], dtype=dtype)[ids]

    def _values(self, names: tuple[str, ...], shape: int) -> tuple[Any, ...]:
        out = []
        for name in names:
            column = self.table.shape_column(name)
            out.append(column.values[column.codes[shape]])
        return tuple(out)

    def _groups(self, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(combination id per shape, first shape of each combination); depends on the table
        only, so it is kept with it."""
        table, rows = self.table, self.rows

        def build() -> tuple[np.ndarray, np.ndarray]:
            key = np.zeros(len(rows), dtype=np.int64)
            for name in names:
                column = table.shape_column(name)
                key = key * max(len(column.values), 1) + column.codes
            _, first, ids = np.unique(key, return_index=True, return_inverse=True)
            return ids.reshape(-1), first

        return table.memo("shape-groups:" + ",".join(names), build)  # type: ignore[no-any-return]

    def _type_keys(self) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
        """(group per shape, (model, provider, type) per group): figures depend on a type's
        probes where there are per-type measurements, else on the GPU model alone."""
        if self._kinds is None:
            per_type = bool(self.rules.measured_types)
            by = ("provider", "instance_type", "gpu_model") if per_type else ("gpu_model",)
            ids, first = self._groups(by)
            names = ("gpu_model", "provider", "instance_type")
            keys = [self._values(names, int(i)) for i in first.tolist()]
            self._kinds = ids, keys
        return self._kinds

    def figure(self, dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """(per-GPU TFLOPS or NaN, measured?) per shape: `RuleContext.figure`'s."""
        found = self._figures.get(dtype)
        if found is None:
            ids, keys = self._type_keys()
            figures = [self.rules.figure(m, dtype, p, k) for m, p, k in keys]
            found = self._figures[dtype] = (
                _nan([f[0] for f in figures])[ids],
                np.asarray([f[1] == MEASURED for f in figures], dtype=bool)[ids],
            )
        return found

    def bandwidth(self) -> tuple[np.ndarray, np.ndarray]:
        """(per-GPU GB/s or NaN, measured?) per shape: `RuleContext.bandwidth`'s."""
        if self._bandwidth is None:
            ids, keys = self._type_keys()
            copies = [self.rules.bandwidth(m, p, k) for m, p, k in keys]
            self._bandwidth = (
                _nan([c[0] for c in copies])[ids],
                np.asarray([c[1] == MEASURED for c in copies], dtype=bool)[ids],
            )
        return self._bandwidth


@dataclass(frozen=True, slots=True)
class Prices:
    """Prices as a price rule's `mask` reads them: the engine's are one per offer, the
    backtest's a snapshots x pools matrix (per-pool fields then broadcast along it)."""

    usd_per_hour: np.ndarray
    gpu_count: np.ndarray
    spot: np.ndarray  # bool: a spot offer
    on_demand: np.ndarray  # the on-demand reference, NaN where there is none
    hours_left: Callable[[], float | np.ndarray]  # of the budget month, at each price's time
    # The distinct (provider, region) pairs and each price's index into them, where the
    # caller knows the offers (the engine; not the backtest, which ranks no job's state)
    places: Callable[[], tuple[list[tuple[str, str]], np.ndarray]] | None = None


class Rule(ABC):
    """A rule: its id (what a rejection names) and whether a policy sets it at all. Its
    checks are abstract: a rule without both cannot be built."""

    id: ClassVar[str]

    def applies(self, rules: RuleContext) -> bool:
        """False where the policy in force does not set this rule: it then passes every
        offer, and no check runs."""
        return True

    def __repr__(self) -> str:
        return f"<rule {self.id}>"


class ObservationRule(Rule):
    """A rule on when a price was observed (`stale`)."""

    @abstractmethod
    def why(self, rules: RuleContext, observed_at: datetime) -> str | None:
        """Why the rule rejects a price observed then, or None where it passes."""
        ...

    @abstractmethod
    def mask(self, rules: RuleContext, table: OfferTable) -> np.ndarray:
        """Per row of the table: True where the rule rejects it."""
        ...


class ShapeRule(Rule):
    """A rule on the offer's shape alone."""

    @abstractmethod
    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        """Why the rule rejects this shape, or None where it passes."""
        ...

    @abstractmethod
    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        """Per shape: True where the rule rejects it."""
        ...


class PriceRule(Rule):
    """A rule on the price."""

    @abstractmethod
    def why(self, rules: RuleContext, priced: Priced) -> str | None:
        """Why the rule rejects this price, or None where it passes."""
        ...

    @abstractmethod
    def mask(self, rules: RuleContext, prices: Prices) -> np.ndarray:
        """Per price: True where the rule rejects it."""
        ...


def exceeds(usd_per_hour: Any, limit: Any) -> Any:
    """Whether a price is over a limit (scalars or arrays), with `SLACK` so a price equal to
    the limit as written passes."""
    return usd_per_hour > limit * (1 + SLACK)


class BidCap(PriceRule):
    """A price rule that caps the bid: `limit` is the highest USD/h it allows, and a price
    over it (or, where `limit` is NaN, any price: nothing to compare with) is rejected.
    `spot_only` caps only spot offers."""

    spot_only: ClassVar[bool] = False

    @abstractmethod
    def sets(self, bid: Bid) -> bool:
        """Whether this bid block sets the cap."""
        ...

    @abstractmethod
    def limit(self, bid: Bid, gpu_count: Any, on_demand: Any) -> Any:
        """The highest USD/h the cap allows an instance of `gpu_count` GPUs whose on-demand
        reference is `on_demand` (scalars or arrays; None where it is unknown); None where
        the bid block does not set the cap."""
        ...

    def applies(self, rules: RuleContext) -> bool:
        return self.sets(rules.bid)

    def mask(self, rules: RuleContext, prices: Prices) -> np.ndarray:
        limit = self.limit(rules.bid, prices.gpu_count, prices.on_demand)
        with np.errstate(invalid="ignore"):
            over = exceeds(prices.usd_per_hour, limit) | np.isnan(limit)
        return prices.spot & over if self.spot_only else over  # type: ignore[no-any-return]
