"""What the policy rules read of one policy at one instant, compiled once per evaluation.

`RuleContext` copies every figure the rules read out of the pydantic model (the policy in
force at `now`: `policies.schedule.effective`) into plain attributes, canonicalizes the
probes' measurements, and holds the memo tables the rules fill (one per evaluation). The
rules themselves are objects in `policies.shape_rules` and `policies.price_rules`, listed in
order by `policies.rulebook`; `policies.rules.RuleSet` runs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from optimizer import hardware
from optimizer.model import Fabric
from policies import budget, schedule
from policies.egress import StatePlace
from policies.measured import DATASHEET, MEASURED, Measured, TypeMeasurement, as_measured
from policies.schema import Policy

# A price stamped this far after `now` is bad data (clock skew, a wrong zone), not a fresh quote.
FUTURE_SKEW = timedelta(minutes=5)
# Relative slack on every limit, so a figure equal to the limit as written is not lost to float
# rounding (70 x 1.2 may land a hair above 84).
SLACK = 1e-9


def fabric_meets(offered: str, needed: str) -> bool:
    """Whether an offer's fabric (a `Fabric` value) meets a policy's `fabric` need."""
    if needed == "any":
        return True
    if needed == "fast":
        return offered != Fabric.NONE
    return offered == needed.replace("-", "_")


class EvaluationError(ValueError):
    """An argument to `evaluate` that cannot be right (a naive `now`, a bad measured figure)."""


@dataclass(frozen=True, slots=True)
class Fit:
    """What a shape that passes the offer-independent rules contributes to a candidate."""

    node_tflops: float | None  # for the ranking dtype
    memory_headroom: float | None
    throughput: str | None = None  # where node_tflops came from: measured | datasheet
    measurement: TypeMeasurement | None = None  # the type's probes, where they measured it
    node_tbps: float | None = None  # memory bandwidth, whole node, TB/s
    bandwidth: str | None = None  # where node_tbps came from: measured | datasheet
    probe_failures: str | None = None  # why the type is demoted, if it is


def number_text(value: float) -> str:
    """A figure as people write it: 70, 2496, 989.4."""
    return f"{value:.6g}"


def usd(value: float) -> str:
    """An hourly price, to four decimals with trailing zeros dropped: $41.2, $0.0123."""
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return f"${text}"


def hours_text(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 3600:.1f} h"


def _figures(what: str, figures: Mapping[str, float]) -> dict[str, float]:
    """Per-dtype figures keyed by canonical dtype; bad figures raise."""
    out: dict[str, float] = {}
    for dtype, value in figures.items():
        key = dtype.strip().lower()
        if key not in hardware.DTYPES:
            raise EvaluationError(f"measured {what}: unknown dtype {dtype!r}")
        _check(f"{what} {dtype}", value)
        out[key] = float(value)
    return out


def _check(what: str, value: object) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):  # type: ignore[arg-type,operator]
        raise EvaluationError(f"measured {what}: {value!r} is not >= 0")


def _canonical_measured(
    measured: Mapping[str, Mapping[str, float]] | None,
) -> dict[str, dict[str, float]]:
    """Measured figures keyed by canonical GPU name and dtype; bad figures raise."""
    out: dict[str, dict[str, float]] = {}
    for model, figures in (measured or {}).items():
        spec = hardware.lookup(model)
        name = spec.name if spec is not None else model
        out.setdefault(name, {}).update(_figures(model, figures))
    return out


def _canonical_types(measured: Measured) -> dict[tuple[str, str], TypeMeasurement]:
    """Per-type measurements with canonical dtypes; bad figures raise."""
    out: dict[tuple[str, str], TypeMeasurement] = {}
    for (provider, kind), found in measured.types.items():
        what = f"{provider} {kind}"
        if found.copy_gbps is not None:
            _check(f"{what} copy_gbps", found.copy_gbps)
        if found.newest_at.tzinfo is None:
            raise EvaluationError(f"measured {what}: newest_at must be timezone-aware")
        tflops = _figures(what, found.tflops)
        out[(provider, kind)] = TypeMeasurement(tflops, found.copy_gbps, found.n, found.newest_at)
    return out


class RuleContext:
    """One policy's figures, ready for the rules to read fast; holds memo tables: one per
    evaluation.

    The figures are those of the policy in force at `now` (`policies.schedule.effective`): a
    schedule window's markets, bid, placement and rank_by in place of the top-level ones
    while it is in force, so no caller can rank a scheduled policy as written."""

    def __init__(
        self,
        policy: Policy,
        now: datetime,
        measured: Measured | Mapping[str, Mapping[str, float]] | None = None,
        committed: budget.Committed | None = None,
        state: StatePlace | None = None,
    ) -> None:
        if now.tzinfo is None:
            raise EvaluationError("now must be timezone-aware (UTC)")
        self.now = now.astimezone(UTC)
        policy = schedule.effective(policy, self.now)
        work, place, bid = policy.workload, policy.placement, policy.bid
        self.buffer = policy.buffer
        grow = 1 + policy.buffer

        # stale: without max_price_age_hours every observation is accepted, future ones too.
        self.max_age_hours = policy.max_price_age_hours or 0.0
        if policy.max_price_age_hours is None:
            self.oldest = datetime.min.replace(tzinfo=UTC)
            self.newest = datetime.max.replace(tzinfo=UTC)
        else:
            self.oldest = self.now - timedelta(hours=policy.max_price_age_hours)
            self.newest = self.now + FUTURE_SKEW

        self.markets: dict[str, int] = {m: i for i, m in enumerate(policy.markets)}
        self.providers = frozenset(place.providers)
        self.allow = tuple(place.regions.allow)
        self.deny = tuple(place.regions.deny)
        self.compliance = place.compliance
        self.countries = tuple(place.countries)
        self.gpu_models = frozenset(work.gpu_models)
        self.gpus = work.gpus
        self.memory_raw = work.gpu_memory_need_gib()
        self.memory_need = policy.memory_need_gib()
        self.fp64 = work.fp64
        self.nvlink = work.interconnect == "nvlink"
        self.fabric = work.fabric
        self.min_tflops = {d: (v, v * grow) for d, v in work.min_tflops.items()}
        self.dtype = work.dtype()
        self.per_tflop = policy.rank_by == "price_per_tflop"
        # price_per_step: the engine orders by price per TFLOP, those without a figure last
        # (none is rejected for it: the job may have measured its own speed there);
        # policies/per_step.py re-ranks with the job's speeds.
        self.per_step = policy.rank_by == "price_per_step"
        self.per_tbps = policy.rank_by == "price_per_tbps"
        self.cpu_memory = work.cpu_memory_gib
        self.vcpus = work.vcpus
        self.bid = bid
        self.monthly_usd = policy.budget.monthly_usd
        self.hours_per_month = policy.budget.hours_per_month
        self.committed = committed or budget.NOTHING
        # A launch under a multi-node workload starts `nodes` instances of the offer: the
        # budget projects each of them (policies/budget.py).
        self.nodes = work.nodes
        self.budget_hours = budget.hours_left(self.now, self.hours_per_month)
        # Data gravity (policies/data_rules.py): where the job's state is, if it has one.
        self.state = state
        self.data_allow = tuple(policy.data.regions.allow)
        self.max_move_usd = policy.data.max_move_usd
        # The whole policy in force, for a rule whose figures are not copied out above.
        self.policy = policy

        given = as_measured(measured)
        self.measured = _canonical_measured(given.models)
        self.measured_types = _canonical_types(given)
        self.demoted = dict(given.demoted)
        self._figure_memo: dict[tuple[str, str, str, str], tuple[float | None, str]] = {}
        self._memos: dict[str, dict[Any, Any]] = {}

    def memo(self, name: str) -> dict[Any, Any]:
        """A memo table for one rule's verdicts (by value: a region, a GPU model), kept for
        this evaluation."""
        found = self._memos.get(name)
        if found is None:
            found = self._memos[name] = {}
        return found

    def figure(
        self, gpu_model: str, dtype: str, provider: str = "", instance_type: str = ""
    ) -> tuple[float | None, str]:
        """(per-GPU TFLOPS for dtype, `measured` or `datasheet`): the type's probes' figure,
        else the model's measured one, else the hardware table's; None where there is no
        positive figure."""
        key = (gpu_model, dtype, provider, instance_type)
        found = self._figure_memo.get(key)
        if found is None:
            by_type = self.measured_types.get((provider, instance_type))
            value = by_type.tflops.get(dtype) if by_type is not None else None
            if value is None:
                value = self.measured.get(gpu_model, {}).get(dtype)
            source = MEASURED if value is not None else DATASHEET
            if value is None:
                value = hardware.get(gpu_model).tflops_for(dtype)
            # A zero figure cannot carry a workload or divide a price.
            found = self._figure_memo[key] = (value if value else None, source)
        return found

    def bandwidth(
        self, gpu_model: str, provider: str, instance_type: str
    ) -> tuple[float | None, str]:
        """(per-GPU memory bandwidth in GB/s, `measured` or `datasheet`): the type's probes'
        device copy figure, else the hardware table's; None where there is no positive figure."""
        by_type = self.measured_types.get((provider, instance_type))
        if by_type is not None and by_type.copy_gbps:
            return by_type.copy_gbps, MEASURED
        return hardware.get(gpu_model).memory_bandwidth_gbs or None, DATASHEET
