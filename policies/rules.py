"""One policy's rules at one instant, ready to check offers: `RuleSet`.

A `RuleSet` is the policy's figures (`policies.context.RuleContext`) and the rules registered
when it was built (`policies.rulebook`), in checking order, less those the policy does not
set. The engine reads its verdicts from the rules' masks (`policies.columnar`); `shape`,
`price` and `stale` run each rule's check one offer at a time, which is how the row engine
(the property test's oracle, tests/helpers/row_engine.py) ranks. A verdict is
`(rule, reason)`; the reason names the numbers so a user can see how far an offer missed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from optimizer.model import Fabric
from policies import budget, rulebook
from policies.context import (
    FUTURE_SKEW,
    EvaluationError,
    Fit,
    RuleContext,
    fabric_meets,
    usd,
)
from policies.egress import StatePlace
from policies.measured import Measured
from policies.price_rules import STALE
from policies.rule import Priced, PriceRule, Rule, Shape, ShapeRule
from policies.schema import Policy

__all__ = [
    "FUTURE_SKEW",
    "RULES",
    "EvaluationError",
    "Fit",
    "RuleSet",
    "Verdict",
    "fabric_meets",
    "usd",
]

RULES: tuple[str, ...] = rulebook.BUILT_IN
"""The built-in rule ids in checking order; an offer is rejected by the first one it fails."""

Verdict = tuple[str, str]
"""(rule id, human reason) for an offer that fails a rule."""


class RuleSet(RuleContext):
    """One policy's rules, ready to check offers fast. Holds memo tables: one per evaluation."""

    def __init__(
        self,
        policy: Policy,
        now: datetime,
        measured: Measured | Mapping[str, Mapping[str, float]] | None = None,
        committed: budget.Committed | None = None,
        state: StatePlace | None = None,
    ) -> None:
        super().__init__(policy, now, measured, committed, state)
        self.checks: tuple[Rule, ...] = rulebook.current()
        """Every registered rule, in order: a verdict is an index into it."""
        self.ids = tuple(rule.id for rule in self.checks)
        self.stale_index = self.checks.index(STALE)
        self.shape_at = {i: r for i, r in enumerate(self.checks) if isinstance(r, ShapeRule)}
        """Each shape rule by its index in `checks`."""
        self.price_at = {i: r for i, r in enumerate(self.checks) if isinstance(r, PriceRule)}
        """Each price rule by its index in `checks`."""
        self.shape_checks = tuple((i, r) for i, r in self.shape_at.items() if r.applies(self))
        """(index, rule) of each shape rule the policy sets, in order."""
        self.price_checks = tuple((i, r) for i, r in self.price_at.items() if r.applies(self))
        """(index, rule) of each price rule the policy sets, in order."""
        self.prices_capped = bool(self.price_checks)

    def stale(self, observed_at: datetime) -> str:
        """Why an observation outside [oldest, newest] is rejected (the caller checked)."""
        return STALE.why(self, observed_at) or ""

    def shape(
        self,
        market: str,
        provider: str,
        region: str,
        instance_type: str,
        gpu_model: str,
        gpu_count: int,
        gpu_memory_gib: float,
        interconnect: str,
        vcpus: int,
        ram_gib: float,
        fabric: str = Fabric.NONE,
    ) -> Verdict | Fit:
        """The shape rules, in order: the first failing rule, else what the shape offers."""
        shape = Shape(
            market,  # type: ignore[arg-type]
            provider,
            region,
            instance_type,
            gpu_model,
            gpu_count,
            gpu_memory_gib,
            interconnect,  # type: ignore[arg-type]
            vcpus,
            ram_gib,
            fabric,  # type: ignore[arg-type]
        )
        for _, rule in self.shape_checks:
            why = rule.why(self, shape)
            if why is not None:
                return rule.id, why
        per_gpu, source = self.figure(gpu_model, self.dtype, provider, instance_type)
        node = gpu_count * per_gpu if per_gpu is not None else None
        headroom = gpu_memory_gib / self.memory_need - 1 if self.memory_need else None
        per_gpu_gbps, bandwidth = self.bandwidth(gpu_model, provider, instance_type)
        return Fit(
            node_tflops=node,
            memory_headroom=headroom,
            throughput=source if node is not None else None,
            measurement=self.measured_types.get((provider, instance_type)),
            node_tbps=gpu_count * per_gpu_gbps / 1000 if per_gpu_gbps is not None else None,
            bandwidth=bandwidth if per_gpu_gbps is not None else None,
            probe_failures=self.demoted.get((provider, instance_type)),
        )

    def price(
        self,
        usd_per_hour: float,
        gpu_count: int,
        market: str,
        on_demand: float | None,
        instance_type: str,
        region: str,
        provider: str = "",
    ) -> Verdict | None:
        """The price rules (the bid caps, the budget, the move of the job's state), in
        order; None when the price passes them all."""
        priced = Priced(usd_per_hour, gpu_count, market, on_demand, instance_type, region, provider)  # type: ignore[arg-type]
        for _, rule in self.price_checks:
            why = rule.why(self, priced)
            if why is not None:
                return rule.id, why
        return None
