"""The one ordered list of policy rules, which everything that applies a rule reads.

The engine (`policies.rules.RuleSet`, `policies.columnar`), the backtest
(`policies.backtest`), the console's bid-cap line and the daemon's cap signals all read this
list. Its order is the checking order: an offer is rejected by the first rule it fails, and
the levels come in turn, `stale`, the shape rules (`policies.shape_rules`), the price rules
(`policies.price_rules`), with the data-gravity rules (`policies.data_rules`) among them.

A rule in the tree is one entry in its level's tuple. `register` adds one from outside (a
plugin, a test) at its place; a `RuleSet` built after it applies it.
"""

from __future__ import annotations

from typing import Any

from policies.data_rules import DATA_REGIONS, MAX_MOVE
from policies.price_rules import PRICE_RULES, STALE
from policies.rule import BidCap, ObservationRule, PriceRule, Rule, ShapeRule
from policies.schema import Bid
from policies.shape_rules import SHAPE_RULES

_BOOK: list[Rule] = [STALE, *SHAPE_RULES, *PRICE_RULES]
# Data gravity (policies/data_rules.py): where the job's state may go after the placement
# rules, and what moving it may cost after the bid caps (the budget stays last).
_BOOK.insert(next(i for i, r in enumerate(_BOOK) if r.id == "compliance") + 1, DATA_REGIONS)
_BOOK.insert(next(i for i, r in enumerate(_BOOK) if r.id == "budget"), MAX_MOVE)
BUILT_IN: tuple[str, ...] = tuple(rule.id for rule in _BOOK)
"""The ids of the rules gpuopt ships, in checking order."""


class RulebookError(ValueError):
    """A rule that cannot be registered where asked (a taken id, the wrong level)."""


def current() -> tuple[Rule, ...]:
    """Every registered rule, in checking order."""
    return tuple(_BOOK)


def _level(rule: Rule) -> type[Rule]:
    for level in (ObservationRule, ShapeRule, PriceRule):
        if isinstance(rule, level):
            return level
    raise RulebookError(f"{rule!r} is not a ShapeRule or PriceRule (policies/rule.py)")


def register(rule: ShapeRule | PriceRule, *, before: str | None = None) -> None:
    """Add `rule` to the list: before the rule with id `before`, which must be of the same
    level (a shape rule among the shape rules), or, without `before`, after the last rule of
    its level."""
    level = _level(rule)
    if level is ObservationRule:
        raise RulebookError("stale is the only rule on the observation time")
    if not getattr(rule, "id", ""):
        raise RulebookError(f"{type(rule).__name__} has no id")
    if any(r.id == rule.id for r in _BOOK):
        raise RulebookError(f"a rule {rule.id!r} is already registered")
    same = [i for i, r in enumerate(_BOOK) if _level(r) is level]
    if before is None:
        at = same[-1] + 1
    else:
        at = next((i for i, r in enumerate(_BOOK) if r.id == before), -1)
        if at < 0:
            raise RulebookError(f"no rule {before!r} to register {rule.id!r} before")
        if at not in same:
            raise RulebookError(
                f"{rule.id!r} is a {level.__name__}: it goes among those, not before {before!r}"
            )
    _BOOK.insert(at, rule)


def unregister(rule_id: str) -> None:
    """Remove a rule that `register` added."""
    if rule_id in BUILT_IN:
        raise RulebookError(f"{rule_id!r} is built in")
    _BOOK[:] = [r for r in _BOOK if r.id != rule_id]


def bid_caps() -> tuple[BidCap, ...]:
    """The registered bid caps, in checking order."""
    return tuple(r for r in _BOOK if isinstance(r, BidCap))


def any_bid_cap(bid: Bid) -> bool:
    """Whether this bid block sets any cap."""
    return any(cap.sets(bid) for cap in bid_caps())


def bid_cap(bid: Bid, gpu_count: int, on_demand: float | None) -> float | None:
    """The highest spot price this bid block's caps allow an instance of `gpu_count` GPUs
    whose on-demand price is `on_demand` (None: unknown, so no cap relative to it); None
    where no cap applies."""
    limits: list[Any] = []
    for cap in bid_caps():
        limit = cap.limit(bid, gpu_count, on_demand)
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def around_bid_caps() -> tuple[frozenset[str], frozenset[str]]:
    """(the bid caps' ids, the ids of the rules checked after every bid cap): an offer one of
    the latter rejected passed every cap."""
    book = current()
    caps = [i for i, rule in enumerate(book) if isinstance(rule, BidCap)]
    later = book[caps[-1] + 1 :] if caps else ()
    return frozenset(book[i].id for i in caps), frozenset(rule.id for rule in later)
