"""The rules a policy applies to each offer, in the order the engine checks them.

`RuleSet` compiles one policy once: every figure the rules read is copied out of the pydantic
model into plain attributes, and the checks that depend on one value only (a region, a GPU
model) are memoized in plain dicts. A verdict is `(rule, reason)`; the reason names the numbers
so a user can see how far an offer missed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase

from optimizer import hardware
from optimizer.model import Fabric, Interconnect, Market
from policies import budget, regions, schedule
from policies.measured import DATASHEET, MEASURED, Measured, TypeMeasurement, as_measured
from policies.schema import Policy

RULES: tuple[str, ...] = (
    "stale",
    "market",
    "provider",
    "region",
    "compliance",
    "gpu_model",
    "gpu_count",
    "gpu_memory",
    "fp64",
    "interconnect",
    "fabric",
    "throughput",
    "cpu_memory",
    "vcpus",
    "bid.max_usd_per_hour",
    "bid.max_usd_per_gpu_hour",
    "bid.max_fraction_of_on_demand",
    "budget",
)
"""Rule ids in checking order; an offer is rejected by the first one it fails."""

# A price stamped this far after `now` is bad data (clock skew, a wrong zone), not a fresh quote.
FUTURE_SKEW = timedelta(minutes=5)
# Relative slack on every limit, so a figure equal to the limit as written is not lost to float
# rounding (70 x 1.2 may land a hair above 84).
_SLACK = 1e-9

Verdict = tuple[str, str]
"""(rule id, human reason) for an offer that fails a rule."""


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


def _n(value: float) -> str:
    """A figure as people write it: 70, 2496, 989.4."""
    return f"{value:.6g}"


def usd(value: float) -> str:
    """An hourly price, to four decimals with trailing zeros dropped: $41.2, $0.0123."""
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return f"${text}"


def _utc_text(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _hours(delta: timedelta) -> str:
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


class RuleSet:
    """One policy's rules, ready to check offers fast. Holds memo tables: one per evaluation.

    The rules are those of the policy in force at `now` (`policies.schedule.effective`): a
    schedule window's markets, bid, placement and rank_by in place of the top-level ones
    while it is in force, so no caller can rank a scheduled policy as written."""

    def __init__(
        self,
        policy: Policy,
        now: datetime,
        measured: Measured | Mapping[str, Mapping[str, float]] | None = None,
        committed: budget.Committed | None = None,
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
        self.per_tbps = policy.rank_by == "price_per_tbps"
        self.cpu_memory = work.cpu_memory_gib
        self.vcpus = work.vcpus
        self.max_usd_per_hour = bid.max_usd_per_hour
        self.max_usd_per_gpu_hour = bid.max_usd_per_gpu_hour
        self.max_fraction = bid.max_fraction_of_on_demand
        self.monthly_usd = policy.budget.monthly_usd
        self.hours_per_month = policy.budget.hours_per_month
        self.committed = committed or budget.NOTHING
        # A launch under a multi-node workload starts `nodes` instances of the offer: the
        # budget projects each of them (policies/budget.py).
        self.nodes = work.nodes
        self.budget_hours = budget.hours_left(self.now, self.hours_per_month)
        caps = (self.max_usd_per_hour, self.max_usd_per_gpu_hour, self.max_fraction)
        self.prices_capped = self.monthly_usd is not None or any(c is not None for c in caps)

        given = as_measured(measured)
        self.measured = _canonical_measured(given.models)
        self.measured_types = _canonical_types(given)
        self.demoted = dict(given.demoted)
        self._place_memo: dict[tuple[str, str], Verdict | None] = {}
        self._figure_memo: dict[tuple[str, str, str, str], tuple[float | None, str]] = {}
        self._fp64_memo: dict[str, str | None] = {}
        self._stale_memo: dict[datetime, str] = {}

    # --- stale ----------------------------------------------------------------------------

    def stale(self, observed_at: datetime) -> str:
        """Why an observation outside [oldest, newest] is rejected (the caller checked)."""
        found = self._stale_memo.get(observed_at)
        if found is None:
            when = _utc_text(observed_at)
            if observed_at > self.newest:
                ahead = _hours(observed_at - self.now)
                reason = f"observed in the future: {when} is {ahead} after now"
            else:
                age = _hours(self.now - observed_at)
                reason = f"observed {when}, {age} ago > max age {_n(self.max_age_hours)} h"
            found = self._stale_memo[observed_at] = reason
        return found

    # --- rules that depend on the offer's shape only --------------------------------------

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
        """market through vcpus, in order: the first failing rule, else what the shape offers."""
        if market not in self.markets:
            return "market", f"{market} not allowed (markets: {', '.join(self.markets)})"
        if provider not in self.providers:
            allowed = ", ".join(sorted(self.providers))
            return "provider", f"{provider} not allowed (providers: {allowed})"
        place = self._place(provider, region)
        if place is not None:
            return place
        if self.gpu_models and gpu_model not in self.gpu_models:
            allowed = ", ".join(sorted(self.gpu_models))
            return "gpu_model", f"{gpu_model} is not one of the allowed models ({allowed})"
        if gpu_count < self.gpus:
            return "gpu_count", f"{gpu_count} GPUs < {self.gpus} needed"
        if gpu_memory_gib < self.memory_need * (1 - _SLACK):
            return "gpu_memory", (
                f"{gpu_memory_gib:.1f} GiB per GPU < {self.memory_need:.1f} GiB needed "
                f"({_n(self.memory_raw)} + {_n(self.buffer * 100)}% buffer)"
            )
        if self.fp64:
            why = self._no_fp64(gpu_model)
            if why is not None:
                return "fp64", why
        # gpu_count >= gpus here, so this spares only one GPU asked and one offered: with
        # nothing to link, nothing lacks NVLink. Any multi-GPU offer must have it.
        if self.nvlink and gpu_count > 1 and interconnect != Interconnect.NVLINK:
            return "interconnect", f"{interconnect} between {gpu_count} GPUs; NVLink required"
        if self.fabric != "any" and not fabric_meets(fabric, self.fabric):
            return "fabric", f"inter-node fabric {Fabric(fabric).value}; {self.fabric} required"
        why = self._throughput(gpu_model, gpu_count, provider, instance_type)
        if why is not None:
            return "throughput", why
        if ram_gib < self.cpu_memory * (1 - _SLACK):
            return "cpu_memory", f"{ram_gib:.1f} GiB RAM < {_n(self.cpu_memory)} GiB needed"
        if vcpus < self.vcpus:
            return "vcpus", f"{vcpus} vCPUs < {self.vcpus} needed"
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

    def _place(self, provider: str, region: str) -> Verdict | None:
        key = (provider, region)
        if key in self._place_memo:
            return self._place_memo[key]
        verdict: Verdict | None = None
        denied = next((g for g in self.deny if fnmatchcase(region, g)), None)
        if denied is not None:
            verdict = ("region", f"{region} matches deny glob {denied!r}")
        elif not any(fnmatchcase(region, g) for g in self.allow):
            verdict = ("region", f"{region} matches no allow glob ({', '.join(self.allow)})")
        else:
            why = regions.check(
                provider, region, compliance=self.compliance, countries=self.countries
            )
            if why is not None:
                verdict = ("compliance", why)
        self._place_memo[key] = verdict
        return verdict

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

    def _no_fp64(self, gpu_model: str) -> str | None:
        # The table says whether a chip has FP64 units; a measurement does not change the chip.
        if gpu_model not in self._fp64_memo:
            spec = hardware.get(gpu_model)
            why: str | None = None
            if not spec.known:
                why = f"unknown GPU model: no FP64 figure ({gpu_model})"
            elif not spec.has_fp64_units:
                fp64 = spec.tflops.fp64
                have = "no FP64 figure" if fp64 is None else f"{_n(fp64)} TFLOPS FP64"
                why = (
                    f"{gpu_model} has no real FP64 units "
                    f"({have} < {_n(hardware.FP64_UNITS_MIN_TFLOPS)})"
                )
            self._fp64_memo[gpu_model] = why
        return self._fp64_memo[gpu_model]

    def _throughput(
        self, gpu_model: str, gpu_count: int, provider: str, instance_type: str
    ) -> str | None:
        unknown = "unknown GPU model " if gpu_model.startswith(hardware.UNKNOWN_PREFIX) else ""
        for dtype, (raw, need) in self.min_tflops.items():
            per_gpu, source = self.figure(gpu_model, dtype, provider, instance_type)
            if per_gpu is None:
                return f"{unknown}{gpu_model} has no {dtype} figure"
            node = gpu_count * per_gpu
            if node < need * (1 - _SLACK):
                how = " (measured)" if source == MEASURED else ""
                return (
                    f"{dtype}: {gpu_count} x {_n(per_gpu)} TFLOPS{how} = {_n(node)} TFLOPS "
                    f"< {_n(need)} needed ({_n(raw)} + {_n(self.buffer * 100)}% buffer)"
                )
        if (
            self.per_tflop
            and self.figure(gpu_model, self.dtype, provider, instance_type)[0] is None
        ):
            return f"{unknown}{gpu_model} has no {self.dtype} figure to rank by price per TFLOP"
        if self.per_tbps and self.bandwidth(gpu_model, provider, instance_type)[0] is None:
            return f"{unknown}{gpu_model} has no memory bandwidth figure to rank by price per TB/s"
        return None

    # --- rules that depend on the price ---------------------------------------------------

    def price(
        self,
        usd_per_hour: float,
        gpu_count: int,
        market: str,
        on_demand: float | None,
        instance_type: str,
        region: str,
    ) -> Verdict | None:
        """The bid caps and the budget, in order; None when the price passes them all."""
        cap = self.max_usd_per_hour
        if cap is not None and usd_per_hour > cap * (1 + _SLACK):
            return "bid.max_usd_per_hour", f"{usd(usd_per_hour)}/h > cap {usd(cap)}/h"
        cap = self.max_usd_per_gpu_hour
        if cap is not None and usd_per_hour > cap * gpu_count * (1 + _SLACK):
            per_gpu = usd_per_hour / gpu_count
            return (
                "bid.max_usd_per_gpu_hour",
                f"{usd(per_gpu)}/GPU-h ({usd(usd_per_hour)}/h over {gpu_count} GPUs) "
                f"> cap {usd(cap)}/GPU-h",
            )
        fraction = self.max_fraction
        if fraction is not None and market == Market.SPOT:
            if on_demand is None:
                return (
                    "bid.max_fraction_of_on_demand",
                    f"no on-demand price for {instance_type} in {region} to compare",
                )
            if usd_per_hour > fraction * on_demand * (1 + _SLACK):
                share = usd_per_hour / on_demand if on_demand else math.inf
                return (
                    "bid.max_fraction_of_on_demand",
                    f"spot {usd(usd_per_hour)}/h is {share:.3f} of on-demand "
                    f"{usd(on_demand)}/h > {_n(fraction)}",
                )
        if self.monthly_usd is not None:
            spend = self.committed
            monthly = budget.projected(
                spend, usd_per_hour, self.now, self.hours_per_month, instances=self.nodes
            )
            if monthly > self.monthly_usd * (1 + _SLACK):
                live = budget.live_text(spend)
                if live:
                    live = f" + {live} at {usd(spend.live_usd_per_hour)}/h"
                new = f"{usd(usd_per_hour)}/h"
                if self.nodes > 1:
                    new = f"{self.nodes} nodes x {new}"
                return (
                    "budget",
                    f"projected ${monthly:,.2f} this month (${spend.spent_usd:,.2f} spent"
                    f"{live} + {new}, for {self.budget_hours:.1f} h) "
                    f"> budget ${self.monthly_usd:,.2f}/month",
                )
        return None
