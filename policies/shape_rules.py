"""The rules on an offer's shape, in checking order (`SHAPE_RULES`): market through vcpus.

Each is one `policies.rule.ShapeRule`: `why` words the reason for one shape, `mask` gives the
verdict for every shape of a table at once; the two must agree (policies/rule.py). Reasons
name the numbers, so a user can see how far an offer missed.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from optimizer import hardware
from optimizer.model import Fabric, Interconnect
from policies import regions
from policies.context import SLACK, RuleContext, fabric_meets
from policies.context import number_text as _n
from policies.measured import MEASURED
from policies.rule import Shape, ShapeColumns, ShapeRule

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np


class MarketRule(ShapeRule):
    id = "market"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.market in rules.markets:
            return None
        return f"{shape.market} not allowed (markets: {', '.join(rules.markets)})"

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each("market", lambda v: v not in rules.markets)


class ProviderRule(ShapeRule):
    id = "provider"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.provider in rules.providers:
            return None
        return f"{shape.provider} not allowed (providers: {', '.join(sorted(rules.providers))})"

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each("provider", lambda v: v not in rules.providers)


class RegionRule(ShapeRule):
    """placement.regions: the deny globs, then the allow globs."""

    id = "region"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        return self._why(rules, shape.region)

    def _why(self, rules: RuleContext, region: str) -> str | None:
        memo = rules.memo(self.id)
        if region not in memo:
            reason = None
            denied = next((g for g in rules.deny if fnmatchcase(region, g)), None)
            if denied is not None:
                reason = f"{region} matches deny glob {denied!r}"
            elif not any(fnmatchcase(region, g) for g in rules.allow):
                reason = f"{region} matches no allow glob ({', '.join(rules.allow)})"
            memo[region] = reason
        return memo[region]  # type: ignore[no-any-return]

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each("region", lambda v: self._why(rules, v) is not None)


class ComplianceRule(ShapeRule):
    """placement.compliance and placement.countries, by the region table (policies/regions.py)."""

    id = "compliance"

    def applies(self, rules: RuleContext) -> bool:
        return rules.compliance is not None or bool(rules.countries)

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        return self._why(rules, shape.provider, shape.region)

    def _why(self, rules: RuleContext, provider: str, region: str) -> str | None:
        memo = rules.memo(self.id)
        key = (provider, region)
        if key not in memo:
            memo[key] = regions.check(
                provider, region, compliance=rules.compliance, countries=rules.countries
            )
        return memo[key]  # type: ignore[no-any-return]

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each_group(
            ("provider", "region"), lambda p, r: self._why(rules, p, r) is not None
        )


class GpuModelRule(ShapeRule):
    id = "gpu_model"

    def applies(self, rules: RuleContext) -> bool:
        return bool(rules.gpu_models)

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.gpu_model in rules.gpu_models:
            return None
        allowed = ", ".join(sorted(rules.gpu_models))
        return f"{shape.gpu_model} is not one of the allowed models ({allowed})"

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each("gpu_model", lambda v: v not in rules.gpu_models)


class GpuCountRule(ShapeRule):
    id = "gpu_count"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.gpu_count < rules.gpus:
            return f"{shape.gpu_count} GPUs < {rules.gpus} needed"
        return None

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.number("gpu_count") < rules.gpus  # type: ignore[no-any-return]


class GpuMemoryRule(ShapeRule):
    """workload.gpu_memory_gib (or what the model needs), plus the policy's buffer."""

    id = "gpu_memory"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.gpu_memory_gib < rules.memory_need * (1 - SLACK):
            return (
                f"{shape.gpu_memory_gib:.1f} GiB per GPU < {rules.memory_need:.1f} GiB needed "
                f"({_n(rules.memory_raw)} + {_n(rules.buffer * 100)}% buffer)"
            )
        return None

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.number("gpu_memory_gib") < rules.memory_need * (1 - SLACK)  # type: ignore[no-any-return]


class Fp64Rule(ShapeRule):
    """workload.fp64: the hardware table says whether a chip has FP64 units; a measurement
    does not change the chip."""

    id = "fp64"

    def applies(self, rules: RuleContext) -> bool:
        return rules.fp64

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        return self._why(rules, shape.gpu_model)

    def _why(self, rules: RuleContext, model: str) -> str | None:
        memo = rules.memo(self.id)
        if model not in memo:
            spec = hardware.get(model)
            reason: str | None = None
            if not spec.known:
                reason = f"unknown GPU model: no FP64 figure ({model})"
            elif not spec.has_fp64_units:
                fp64 = spec.tflops.fp64
                have = "no FP64 figure" if fp64 is None else f"{_n(fp64)} TFLOPS FP64"
                reason = (
                    f"{model} has no real FP64 units "
                    f"({have} < {_n(hardware.FP64_UNITS_MIN_TFLOPS)})"
                )
            memo[model] = reason
        return memo[model]  # type: ignore[no-any-return]

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each("gpu_model", lambda v: self._why(rules, v) is not None)


class InterconnectRule(ShapeRule):
    """workload.interconnect: nvlink. The gpu_count rule ran first, so this spares only one
    GPU asked and one offered: with nothing to link, nothing lacks NVLink."""

    id = "interconnect"

    def applies(self, rules: RuleContext) -> bool:
        return rules.nvlink

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.gpu_count > 1 and shape.interconnect != Interconnect.NVLINK:
            return f"{shape.interconnect} between {shape.gpu_count} GPUs; NVLink required"
        return None

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        other = shapes.each("interconnect", lambda v: v != Interconnect.NVLINK)
        return other & (shapes.number("gpu_count") > 1)  # type: ignore[no-any-return]


class FabricRule(ShapeRule):
    """workload.fabric: the inter-node fabric a multi-node job needs."""

    id = "fabric"

    def applies(self, rules: RuleContext) -> bool:
        return rules.fabric != "any"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if fabric_meets(shape.fabric, rules.fabric):
            return None
        return f"inter-node fabric {Fabric(shape.fabric).value}; {rules.fabric} required"

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.each("fabric", lambda v: not fabric_meets(v, rules.fabric))


class ThroughputRule(ShapeRule):
    """workload.min_tflops per dtype (plus the buffer), on the type's probes' figure, else
    the model's measured one, else the hardware table's; and rank_by needs a figure to
    divide the price by."""

    id = "throughput"

    def applies(self, rules: RuleContext) -> bool:
        return bool(rules.min_tflops) or rules.per_tflop or rules.per_tbps

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        model, count = shape.gpu_model, shape.gpu_count
        provider, kind = shape.provider, shape.instance_type
        unknown = "unknown GPU model " if model.startswith(hardware.UNKNOWN_PREFIX) else ""
        for dtype, (raw, need) in rules.min_tflops.items():
            per_gpu, source = rules.figure(model, dtype, provider, kind)
            if per_gpu is None:
                return f"{unknown}{model} has no {dtype} figure"
            node = count * per_gpu
            if node < need * (1 - SLACK):
                how = " (measured)" if source == MEASURED else ""
                return (
                    f"{dtype}: {count} x {_n(per_gpu)} TFLOPS{how} = {_n(node)} TFLOPS "
                    f"< {_n(need)} needed ({_n(raw)} + {_n(rules.buffer * 100)}% buffer)"
                )
        if rules.per_tflop and rules.figure(model, rules.dtype, provider, kind)[0] is None:
            return f"{unknown}{model} has no {rules.dtype} figure to rank by price per TFLOP"
        if rules.per_tbps and rules.bandwidth(model, provider, kind)[0] is None:
            return f"{unknown}{model} has no memory bandwidth figure to rank by price per TB/s"
        return None

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        count = shapes.number("gpu_count")
        slow = np.zeros(shapes.size, dtype=bool)
        for dtype, (_raw, need) in rules.min_tflops.items():
            per_gpu, _ = shapes.figure(dtype)
            with np.errstate(invalid="ignore"):
                slow = slow | np.isnan(per_gpu) | (count * per_gpu < need * (1 - SLACK))
        if rules.per_tflop:
            slow = slow | np.isnan(shapes.figure(rules.dtype)[0])
        if rules.per_tbps:
            slow = slow | np.isnan(shapes.bandwidth()[0])
        return slow


class CpuMemoryRule(ShapeRule):
    id = "cpu_memory"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.ram_gib < rules.cpu_memory * (1 - SLACK):
            return f"{shape.ram_gib:.1f} GiB RAM < {_n(rules.cpu_memory)} GiB needed"
        return None

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.number("ram_gib") < rules.cpu_memory * (1 - SLACK)  # type: ignore[no-any-return]


class VcpusRule(ShapeRule):
    id = "vcpus"

    def why(self, rules: RuleContext, shape: Shape) -> str | None:
        if shape.vcpus < rules.vcpus:
            return f"{shape.vcpus} vCPUs < {rules.vcpus} needed"
        return None

    def mask(self, rules: RuleContext, shapes: ShapeColumns) -> np.ndarray:
        return shapes.number("vcpus") < rules.vcpus  # type: ignore[no-any-return]


SHAPE_RULES: tuple[ShapeRule, ...] = (
    MarketRule(),
    ProviderRule(),
    RegionRule(),
    ComplianceRule(),
    GpuModelRule(),
    GpuCountRule(),
    GpuMemoryRule(),
    Fp64Rule(),
    InterconnectRule(),
    FabricRule(),
    ThroughputRule(),
    CpuMemoryRule(),
    VcpusRule(),
)
"""The shape rules in checking order; an offer is rejected by the first one it fails."""
