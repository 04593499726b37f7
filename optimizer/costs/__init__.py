"""Cost accounting: each cloud's billing rules and the ledger's pure model (docs/costs.md)."""

from optimizer.costs.billing import BillingRule, rule_for
from optimizer.costs.ledger import (
    Cost,
    Usage,
    billed_span,
    cost,
    integral_usd,
    month_windows,
    monthly,
    total,
)
from optimizer.costs.lines import Group, GroupBy, Line, group_lines

__all__ = [
    "BillingRule",
    "Cost",
    "Group",
    "GroupBy",
    "Line",
    "Usage",
    "billed_span",
    "cost",
    "group_lines",
    "integral_usd",
    "month_windows",
    "monthly",
    "rule_for",
    "total",
]
