"""The verdict: observations + the hardware table + earlier medians -> checks. Pure.

`judge` is the one entry point; `health_rules` and `perf_rules` hold the individual rules.
Nothing here touches a GPU, the clock or the store.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optimizer import hardware
from optimizer.hardware import GpuSpec
from optimizer.probes import health_rules, perf_rules
from optimizer.probes.readings import LoadSummary, NodeHealth, XidEvent
from optimizer.probes.schema import Check, DeviceRun, NodeRun, Status

_VENDOR_WORDS = ("nvidia", "tesla", "amd", "radeon", "instinct")


def gpu_spec(name: str | None, memory_bytes: int | None = None) -> GpuSpec:
    """The hardware-table model for a driver-reported name (`NVIDIA H200`, `Tesla T4`,
    `NVIDIA A100-SXM4-80GB`), using the memory size where one name covers several models."""
    if not name:
        return hardware.unknown("")
    spec = hardware.lookup(name)
    if spec is not None:
        return spec
    words = [w for w in name.replace("-", " ").split() if w.lower() not in _VENDOR_WORDS]
    mib = memory_bytes / (1 << 20) if memory_bytes else None
    if words:
        spec = hardware.lookup(" ".join(words))
        if spec is not None:
            return spec
        found = hardware.from_aws(words[0], mib)
        if found.known:
            return found
    return hardware.unknown(name)


@dataclass(frozen=True, slots=True)
class Observations:
    """Everything a probe run saw. Empty fields mean "not observed", never "healthy"."""

    backend: str = "cuda"  # "cuda", "cpu" (torch, no CUDA device) or "none" (no torch)
    health: NodeHealth | None = None
    nvml_error: str | None = None  # why NVML could not be read, when it could not
    health_after: NodeHealth | None = None
    window_s: float | None = None  # seconds between the two NVML snapshots
    load: Mapping[int, LoadSummary] = field(default_factory=dict)
    xids: tuple[XidEvent, ...] = ()
    runs: tuple[DeviceRun, ...] = ()
    node: NodeRun | None = None
    timeout_s: float | None = None
    backend_note: str | None = None  # e.g. why torch could not be used


def _model_of(obs: Observations) -> tuple[GpuSpec, list[Check]]:
    """The node's GPU model; mixed models on one node warn (rank per GPU then)."""
    specs: list[GpuSpec] = []
    if obs.health is not None:
        specs = [gpu_spec(g.name, g.memory_total_bytes) for g in obs.health.gpus]
    if not specs:
        specs = [
            gpu_spec(r.name, r.info.get("memory_bytes")) for r in obs.runs if r.gpu is not None
        ]
    if not specs:
        return hardware.unknown("cpu" if obs.backend == "cpu" else ""), []
    names = sorted({s.name for s in specs})
    checks = []
    if len(names) > 1:
        checks.append(Check("gpu.models", Status.WARN, f"mixed models: {', '.join(names)}"))
    if not specs[0].known:
        reason = f"{specs[0].raw_name!r} is not in the hardware table: no datasheet figures"
        checks.append(Check("gpu.model", Status.WARN, reason))
    else:
        checks.append(Check("gpu.model", Status.PASS, specs[0].name))
    return specs[0], checks


def _inventory(obs: Observations, expected: int | None) -> list[Check]:
    name = "gpu.count"
    if obs.backend == "none":
        note = obs.backend_note or "torch is not installed"
        out = [Check("torch", Status.WARN, f"{note}: no active probes")]
    else:
        out = []
    if obs.health is None:
        seen = sum(1 for r in obs.runs if r.gpu is not None)
        if seen == 0:
            why = obs.nvml_error or "NVML is not available"
            if expected:
                reason = f"expected {expected} GPU(s), found no CUDA device ({why})"
                return [*out, Check(name, Status.FAIL, reason, value=0)]
            reason = f"no CUDA device ({why}); CPU figures only"
            return [*out, Check("cuda", Status.WARN, reason, value=0)]
        out.append(Check("nvml", Status.WARN, f"NVML unavailable ({obs.nvml_error}): no health"))
    else:
        seen = len(obs.health.gpus)
    if expected is not None and seen < expected:
        reason = f"missing GPU: {seen} of {expected} expected GPUs present"
        out.append(Check(name, Status.FAIL, reason, value=seen))
    elif expected is not None and seen > expected:
        out.append(Check(name, Status.WARN, f"{seen} GPUs, {expected} expected", value=seen))
    else:
        out.append(Check(name, Status.PASS, f"{seen} GPU(s)", value=seen))
    return out


def judge(
    obs: Observations,
    *,
    expected_gpus: int | None = None,
    history: Mapping[str, float] | None = None,
) -> list[Check]:
    """Every check for one probe run, node-wide ones first, then per GPU in index order.

    `history` maps a metric name (see `metrics`) to the median of earlier results for the same
    GPU model.
    """
    history = history or {}
    spec, checks = _model_of(obs)
    checks = _inventory(obs, expected_gpus) + checks
    after = {g.index: g for g in obs.health_after.gpus} if obs.health_after else {}
    gpus = obs.health.gpus if obs.health else ()
    unplaced = [e for e in obs.xids if e.gpu is None or e.gpu >= len(gpus)]
    if unplaced and obs.health is not None:
        checks.append(health_rules.xids([XidEvent(e.xid, None, e.source) for e in unplaced], None))
    for health in gpus:
        checks += health_rules.gpu_checks(
            health,
            after.get(health.index),
            gpu_spec(health.name, health.memory_total_bytes),
            gpus=len(gpus),
            load=obs.load.get(health.index),
            events=obs.xids,
            window_s=obs.window_s,
        )
    by_index = {g.index: g for g in gpus}
    for run in obs.runs:
        g = by_index.get(run.gpu) if run.gpu is not None else None
        pcie = (g.pcie_max_gen, g.pcie_max_width) if g else (None, None)
        run_spec = gpu_spec(g.name, g.memory_total_bytes) if g else spec
        checks += perf_rules.run_checks(
            run, run_spec, history=history, pcie=pcie, timeout_s=obs.timeout_s
        )
    checks += perf_rules.cross_gpu(obs.runs)
    if obs.node is not None:
        checks += perf_rules.allreduce_checks(
            obs.node, spec, history=history, timeout_s=obs.timeout_s
        )
    return sorted(checks, key=lambda c: -1 if c.gpu is None else c.gpu)


def overall(checks: Iterable[Check]) -> Status:
    """pass / warn / fail for the run: its worst check (skips count as pass)."""
    from optimizer.probes.schema import worst

    return worst(c.status for c in checks)


def measured_tflops(model: str | None, runs: Iterable[DeviceRun]) -> dict[str, dict[str, float]]:
    """Per-GPU TFLOPS for the policy engine's `measured` input: the median over the node's
    GPUs per dtype. bf16 takes the sustained figure where one was measured (rank on sustained
    medians, REFERENCE 5.7); the other dtypes are burst figures. A CPU-only run is keyed
    `cpu` (the local cloud's figure)."""
    runs = [r for r in runs if r.ok]
    if not model and any(r.device == "cpu" for r in runs):
        model = "cpu"
    if not model:
        return {}
    per_dtype: dict[str, list[float]] = {}
    for run in runs:
        for g in run.gemm:
            per_dtype.setdefault(g.dtype, []).append(g.tflops)
        if run.sustained is not None:
            per_dtype.setdefault("bf16.sustained", []).append(run.sustained.tflops_median)
    out = {k: statistics.median(v) for k, v in per_dtype.items() if k in hardware.DTYPES}
    if "bf16.sustained" in per_dtype:
        out["bf16"] = statistics.median(per_dtype["bf16.sustained"])
    return {model: out} if out else {}


def metrics(result: Mapping[str, Any]) -> dict[str, list[float]]:
    """Comparable figures in one stored result (its JSON): metric name -> one value per GPU."""
    out: dict[str, list[float]] = {}
    for run in result.get("runs") or ():
        if not run.get("ok") or run.get("gpu") is None:
            continue
        for g in run.get("gemm") or ():
            out.setdefault(f"gemm.{g['dtype']}", []).append(float(g["tflops"]))
        for key in ("copy_gbps", "h2d_gbps", "d2h_gbps"):
            if run.get(key) is not None:
                out.setdefault(key, []).append(float(run[key]))
        if run.get("sustained"):
            out.setdefault("sustained.bf16", []).append(float(run["sustained"]["tflops_median"]))
    node = result.get("node") or {}
    for p in node.get("points") or ():
        if p["nbytes"] == perf_rules.ALLREDUCE_JUDGED_BYTES:
            out.setdefault("allreduce_busbw_gbps", []).append(float(p["busbw_gbps"]))
    return out


def history_medians(results: Iterable[Mapping[str, Any]], model: str) -> dict[str, float]:
    """The median of every metric over earlier results (JSON) for the same GPU model."""
    pooled: dict[str, list[float]] = {}
    for result in results:
        if result.get("gpu_model") != model:
            continue
        for key, values in metrics(result).items():
            pooled.setdefault(key, []).extend(values)
    return {k: statistics.median(v) for k, v in pooled.items() if v}
