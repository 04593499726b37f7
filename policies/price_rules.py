"""The rules on a price: `stale` (checked first, on when it was observed), then the bid caps
and the budget (`PRICE_RULES`, checked after the shape rules), in checking order.

Each is one object (policies/rule.py): `why` words the reason for one price, `mask` gives the
verdicts for many at once, the engine's per offer and the backtest's over its snapshots x
pools matrix. A bid cap says the highest price it allows (`limit`), once, for its checks and
for the console's cap line (`policies.rulebook.bid_cap`).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

from optimizer.clock import utc_text
from optimizer.model import Market
from policies import budget
from policies.context import SLACK, RuleContext, hours_text, usd
from policies.context import number_text as _n
from policies.rule import BidCap, ObservationRule, Priced, PriceRule, Prices, exceeds
from policies.schema import Bid
from policies.table import OfferTable

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np


class StaleRule(ObservationRule):
    """max_price_age_hours: a price older than that, or stamped in the future (past
    `FUTURE_SKEW`), is not a quote to act on. Without the key every observation passes."""

    id = "stale"

    def why(self, rules: RuleContext, observed_at: datetime) -> str | None:
        if not (observed_at < rules.oldest or observed_at > rules.newest):
            return None
        memo = rules.memo(self.id)
        found = memo.get(observed_at)
        if found is None:
            when = utc_text(observed_at, timespec="seconds")
            if observed_at > rules.newest:
                ahead = hours_text(observed_at - rules.now)
                found = f"observed in the future: {when} is {ahead} after now"
            else:
                age = hours_text(rules.now - observed_at)
                found = f"observed {when}, {age} ago > max age {_n(rules.max_age_hours)} h"
            memo[observed_at] = found
        return found  # type: ignore[no-any-return]

    def mask(self, rules: RuleContext, table: OfferTable) -> np.ndarray:
        oldest, newest = rules.oldest, rules.newest
        return table.column("observed_at").map(lambda v: v < oldest or v > newest, dtype=bool)

    def fresh(self, max_age_hours: float, observed: np.ndarray, times: np.ndarray) -> np.ndarray:
        """The backtest's check: per snapshot (row of `observed`, epoch seconds), whether each
        pool's latest price is at most `max_age_hours` old at the snapshot's time."""
        return observed >= times[:, None] - max_age_hours * 3600  # type: ignore[no-any-return]


STALE = StaleRule()


class MaxUsdPerHour(BidCap):
    """bid.max_usd_per_hour: the whole instance."""

    id = "bid.max_usd_per_hour"

    def sets(self, bid: Bid) -> bool:
        return bid.max_usd_per_hour is not None

    def limit(self, bid: Bid, gpu_count: Any, on_demand: Any) -> Any:
        return bid.max_usd_per_hour

    def why(self, rules: RuleContext, priced: Priced) -> str | None:
        limit = self.limit(rules.bid, priced.gpu_count, priced.on_demand)
        if limit is not None and exceeds(priced.usd_per_hour, limit):
            return f"{usd(priced.usd_per_hour)}/h > cap {usd(limit)}/h"
        return None


class MaxUsdPerGpuHour(BidCap):
    """bid.max_usd_per_gpu_hour: per GPU, so the instance's cap grows with its GPUs."""

    id = "bid.max_usd_per_gpu_hour"

    def sets(self, bid: Bid) -> bool:
        return bid.max_usd_per_gpu_hour is not None

    def limit(self, bid: Bid, gpu_count: Any, on_demand: Any) -> Any:
        cap = bid.max_usd_per_gpu_hour
        return None if cap is None else cap * gpu_count

    def why(self, rules: RuleContext, priced: Priced) -> str | None:
        price, count = priced.usd_per_hour, priced.gpu_count
        limit = self.limit(rules.bid, count, priced.on_demand)
        if limit is not None and exceeds(price, limit):
            return (
                f"{usd(price / count)}/GPU-h ({usd(price)}/h over {count} GPUs) "
                f"> cap {usd(rules.bid.max_usd_per_gpu_hour)}/GPU-h"  # type: ignore[arg-type]
            )
        return None


class MaxFractionOfOnDemand(BidCap):
    """bid.max_fraction_of_on_demand: spot only, against the cheapest fresh on-demand price
    of the same provider, region and instance type; without one, nothing to compare with."""

    id = "bid.max_fraction_of_on_demand"
    spot_only = True

    def sets(self, bid: Bid) -> bool:
        return bid.max_fraction_of_on_demand is not None

    def limit(self, bid: Bid, gpu_count: Any, on_demand: Any) -> Any:
        fraction = bid.max_fraction_of_on_demand
        return None if fraction is None or on_demand is None else fraction * on_demand

    def why(self, rules: RuleContext, priced: Priced) -> str | None:
        fraction = rules.bid.max_fraction_of_on_demand
        if fraction is None or priced.market != Market.SPOT:
            return None
        price, on_demand = priced.usd_per_hour, priced.on_demand
        if on_demand is None:
            return f"no on-demand price for {priced.instance_type} in {priced.region} to compare"
        if exceeds(price, self.limit(rules.bid, priced.gpu_count, on_demand)):
            share = price / on_demand if on_demand else math.inf
            return (
                f"spot {usd(price)}/h is {share:.3f} of on-demand "
                f"{usd(on_demand)}/h > {_n(fraction)}"
            )
        return None


class BudgetRule(PriceRule):
    """budget.monthly_usd: this month's spend, the live attempts' prices and the launch
    (every node of it) projected to the month's end (policies/budget.py)."""

    id = "budget"

    def applies(self, rules: RuleContext) -> bool:
        return rules.monthly_usd is not None

    def why(self, rules: RuleContext, priced: Priced) -> str | None:
        cap, spend, price = rules.monthly_usd, rules.committed, priced.usd_per_hour
        if cap is None:
            return None
        monthly = budget.projected(
            spend, price, rules.now, rules.hours_per_month, instances=rules.nodes
        )
        if monthly > cap * (1 + SLACK):
            live = budget.live_text(spend)
            if live:
                live = f" + {live} at {usd(spend.live_usd_per_hour)}/h"
            new = f"{usd(price)}/h"
            if rules.nodes > 1:
                new = f"{rules.nodes} nodes x {new}"
            return (
                f"projected ${monthly:,.2f} this month (${spend.spent_usd:,.2f} spent"
                f"{live} + {new}, for {rules.budget_hours:.1f} h) "
                f"> budget ${cap:,.2f}/month"
            )
        return None

    def mask(self, rules: RuleContext, prices: Prices) -> np.ndarray:
        spend = rules.committed
        new = prices.usd_per_hour * rules.nodes
        monthly = spend.spent_usd + (spend.live_usd_per_hour + new) * prices.hours_left()
        with np.errstate(invalid="ignore"):
            return monthly > rules.monthly_usd * (1 + SLACK)  # type: ignore[no-any-return,operator]


BUDGET = BudgetRule()
"""The budget rule: a launch walk that finds every offer over budget names it by `BUDGET.id`."""

PRICE_RULES: tuple[PriceRule, ...] = (
    MaxUsdPerHour(),
    MaxUsdPerGpuHour(),
    MaxFractionOfOnDemand(),
    BUDGET,
)
"""The price rules in checking order, after the shape rules."""
