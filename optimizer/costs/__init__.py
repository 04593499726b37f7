"""Cost accounting: each cloud's billing rules and the ledger's pure model (docs/costs.md)."""

from optimizer.costs.billing import RULES, BillingRule, rule_for
from optimizer.costs.ledger import Cost, Usage, cost, integral_usd, month_windows, total

__all__ = [
    "RULES",
    "BillingRule",
    "Cost",
    "Usage",
    "cost",
    "integral_usd",
    "month_windows",
    "rule_for",
    "total",
]
