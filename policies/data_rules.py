"""Data gravity: the rules on moving a job's state (its checkpoint) to an offer.

A launch for a job whose checkpoint sits in object storage is ranked with where that state
is (`policies.egress.StatePlace`, handed to `policies.engine.evaluate`). Two rules
read it, and both pass every offer when the ranking has no state (a new job, the console,
the backtest):
- `data.regions` (a shape rule, after `compliance`): the offer's region must match one of
  `data.regions.allow`; an offer in the state's own provider and region moves nothing, so
  it always passes.
- `data.max_move_usd` (a price rule, after the bid caps, before the budget): the move's
  cost, the transfer out of the state's cloud plus the restore's seconds at the offer's
  price (`policies.egress.move_cost`), must not be over the limit.

The ranking adds the same move cost to each candidate's price, spread over the state's
horizon (`StatePlace.horizon_hours`), so a cheap offer across an ocean from a big
checkpoint can rank below a dearer one next to it (policies/engine.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimizer.common.units import size_text
from policies.context import SLACK, RuleContext
from policies.rule import Priced, PriceRule, Prices, Shape, ShapeColumns, ShapeRule
from policies.schema import allowed_region

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np


class DataRegionsRule(ShapeRule):
    """data.regions.allow: the regions a job's state may be moved to."""

    id = "data.regions"

    def applies(self, rules: RuleContext) -> bool:
        return rules.state is not None and rules.data_allow != ("*",)

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        return self._why(rules, shape.provider, shape.region)

    def _why(self, rules: RuleContext, provider: str, region: str) -> str | None:
        state = rules.state
        if state is None or (provider, region) == (state.provider, state.region):
            return None
        if allowed_region(rules.data_allow, region):
            return None
        return (
            f"region {region} is not in data.regions.allow ({', '.join(rules.data_allow)}): "
            f"the job's checkpoint is in {state.provider} {state.region}"
        )

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each_group(
            ("provider", "region"), lambda p, r: self._why(rules, p, r) is not None
        )


class MaxMoveRule(PriceRule):
    """data.max_move_usd: what moving the job's state to the offer may cost."""

    id = "data.max_move_usd"

    def applies(self, rules: RuleContext) -> bool:
        return rules.state is not None and rules.max_move_usd is not None

    def why(self, rules: RuleContext, priced: Priced) -> str | None:
        state, limit = rules.state, rules.max_move_usd
        if state is None or limit is None:
            return None
        cost = state.move(priced.provider, priced.region, priced.usd_per_hour)
        if cost.total_usd <= limit * (1 + SLACK):
            return None
        return (
            f"moving the checkpoint ({size_text(int(state.size_bytes))}, {state.provider} "
            f"{state.region} → {priced.provider} {priced.region}) costs ${cost.total_usd:.2f} "
            f"(${cost.egress_usd:.2f} egress + {cost.restore_s:.0f} s restore), over "
            f"data.max_move_usd ${limit:.2f}"
        )

    def mask(self, rules: RuleContext, prices: Prices) -> np.ndarray:
        state, limit = rules.state, rules.max_move_usd
        size = len(prices.usd_per_hour)
        if state is None or limit is None or prices.places is None or size == 0:
            return np.zeros(size, dtype=bool)
        egress, seconds = move_parts(rules, *prices.places())
        total = egress + seconds * prices.usd_per_hour / 3600
        return total > limit * (1 + SLACK)  # type: ignore[no-any-return]


def move_parts(
    rules: RuleContext, pairs: list[tuple[str, str]], index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(egress USD, restore seconds) per row, from the distinct (provider, region) `pairs`
    and each row's `index` into them (`policies.columnar.places`), each pair priced once per
    evaluation: the move's cost at a price p is egress + seconds * p / 3600, as
    `policies.egress.move_cost` works it out."""
    state = rules.state
    assert state is not None
    memo = rules.memo("data.move")
    for pair in pairs:
        if pair not in memo:
            cost = state.move(pair[0], pair[1], 0.0)
            memo[pair] = (cost.egress_usd, cost.restore_s)
    parts = np.array([memo[pair] for pair in pairs], dtype=np.float64).reshape(-1, 2)
    return parts[index, 0], parts[index, 1]


DATA_REGIONS = DataRegionsRule()
MAX_MOVE = MaxMoveRule()
