"""Performance rules: measured figures against the hardware table and earlier results.

Pure functions. Two yardsticks, the worse verdict wins:
- the datasheet peak (`optimizer/data/gpus.yaml`). Well-run GEMMs reach 77-87% of it on
  NVIDIA parts (REFERENCE 4.2, MAMF), so warn below 0.60 (about 0.75 x a typical efficiency,
  DCGM's own target/measured ratio, REFERENCE 5.6) and fail below 0.45;
- the median of earlier results for the same GPU model, where the store has them: fail below
  0.8 x (the issue's rule), warn below 0.85 x (the upper end of REFERENCE 5.7's reject band).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from optimizer.hardware import GpuSpec
from optimizer.probes.schema import Check, DeviceRun, NodeRun, Status

GEMM_WARN, GEMM_FAIL = 0.60, 0.45  # of the dense datasheet peak
# Copies reach ~89% of the HBM datasheet figure on H200 (REFERENCE 5.2); DCGM's minimum for
# H100 SXM is 57% of it (1,905 of 3,350 GB/s, REFERENCE 5.6).
COPY_WARN, COPY_FAIL = 0.70, 0.50
# Pinned host transfers: IBM Autopilot expects >= 80% of the PCIe generation's peak and alarms
# at <= 25% (REFERENCE 5.6). Per-direction x16 peaks by generation (REFERENCE 5.1).
HOST_WARN, HOST_FAIL = 0.80, 0.25
PCIE_X16_GBPS = {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0}
# All-reduce bus bandwidth at 1 GiB over the per-direction link figure: the H200 pair reaches
# 330 of 450 GB/s (73%, REFERENCE 5.2).
ALLREDUCE_WARN, ALLREDUCE_FAIL = 0.55, 0.35
ALLREDUCE_JUDGED_BYTES = 1 << 30
HISTORY_FAIL, HISTORY_WARN = 0.80, 0.85
SUSTAINED_DROP_WARN = 0.70  # sustained bf16 under 70% of the burst figure: clocks collapsed


def _c(
    name: str,
    status: Status,
    reason: str,
    gpu: int | None,
    value: float | None = None,
    unit: str | None = None,
) -> Check:
    return Check(name, status, reason, gpu, value, unit)


def peak_tflops(spec: GpuSpec, dtype: str) -> float | None:
    """The datasheet peak a GEMM of `dtype` is held to; fp64 GEMMs run on FP64 tensor cores
    where the GPU has them."""
    if dtype == "fp64":
        return spec.tflops_for("fp64_tensor") or spec.tflops_for("fp64")
    return spec.tflops_for(dtype)


def _judge(
    name: str,
    gpu: int | None,
    value: float,
    unit: str,
    *,
    reference: float | None,
    what: str,
    warn: float,
    fail: float,
    history: float | None,
) -> Check:
    status, parts = Status.PASS, [f"{_num(value)} {unit}"]
    if reference:
        ratio = value / reference
        parts.append(f"{ratio:.2f} of {what} {reference:,.0f}")
        if ratio < fail:
            status = Status.FAIL
        elif ratio < warn:
            status = Status.WARN
    else:
        parts.append("on the CPU" if what == "CPU" else f"no {what} figure to compare")
    if history:
        ratio = value / history
        parts.append(f"{ratio:.2f} of the model's median {_num(history)}")
        if ratio < HISTORY_FAIL:
            status = Status.FAIL
        elif ratio < HISTORY_WARN and status is Status.PASS:
            status = Status.WARN
    return _c(name, status, "; ".join(parts), gpu, value, unit)


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):g} GiB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):g} MiB"


def _num(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def host_link_peak(spec: GpuSpec, gen: int | None, width: int | None) -> float | None:
    """Per-direction GB/s of the link NVML says is possible, else of the table's host link."""
    if gen is None and spec.host_link and spec.host_link.kind.startswith("pcie"):
        digits = spec.host_link.kind.removeprefix("pcie")
        gen = int(digits) if digits.isdigit() else None
    if gen is None or gen not in PCIE_X16_GBPS:
        return None
    return PCIE_X16_GBPS[gen] * (width or 16) / 16


def run_checks(
    run: DeviceRun,
    spec: GpuSpec,
    *,
    history: Mapping[str, float],
    pcie: tuple[int | None, int | None] = (None, None),
    timeout_s: float | None = None,
) -> list[Check]:
    """Checks for one device's active probe."""
    gpu = run.gpu
    if not run.ok:
        if run.timed_out:
            reason = (
                f"did not finish within {timeout_s or run.seconds:.0f} s and was killed "
                "(a hang is a symptom, e.g. XID 79)"
            )
        else:
            reason = f"failed: {run.error}"
        return [_c("probe.active", Status.FAIL, reason, gpu)]
    out = [_c("probe.active", Status.PASS, f"finished in {run.seconds:.1f} s", gpu)]
    cpu = run.device == "cpu"
    for g in run.gemm:
        out.append(
            _judge(
                f"gemm.{g.dtype}",
                gpu,
                g.tflops,
                "TFLOP/s",
                reference=None if cpu else peak_tflops(spec, g.dtype),
                what="CPU" if cpu else "datasheet peak",
                warn=GEMM_WARN,
                fail=GEMM_FAIL,
                history=history.get(f"gemm.{g.dtype}"),
            )
        )
    if run.copy_gbps is not None:
        out.append(
            _judge(
                "memory.copy",
                gpu,
                run.copy_gbps,
                "GB/s",
                reference=spec.memory_bandwidth_gbs,
                what="datasheet",
                warn=COPY_WARN,
                fail=COPY_FAIL,
                history=history.get("copy_gbps"),
            )
        )
    link = host_link_peak(spec, *pcie)
    for name, value in (("host.h2d", run.h2d_gbps), ("host.d2h", run.d2h_gbps)):
        if value is not None:
            key = f"{name.split('.')[1]}_gbps"
            out.append(
                _judge(
                    name,
                    gpu,
                    value,
                    "GB/s",
                    reference=link,
                    what="PCIe peak",
                    warn=HOST_WARN,
                    fail=HOST_FAIL,
                    history=history.get(key),
                )
            )
    if run.correctness is not None:
        out.append(_correctness(run))
    if run.sustained is not None:
        out.append(_sustained(run, spec, history))
    if run.memtest is not None:
        m = run.memtest
        gib = m.bytes_tested / (1 << 30)
        if m.mismatches:
            reason = f"{m.mismatches} word(s) read back wrong over {gib:.1f} GiB"
            out.append(_c("memory.pattern", Status.FAIL, reason, gpu, m.mismatches))
        else:
            reason = f"{gib:.1f} GiB x {m.patterns} patterns read back intact"
            out.append(_c("memory.pattern", Status.PASS, reason, gpu, 0))
    return out


def _correctness(run: DeviceRun) -> Check:
    c = run.correctness
    assert c is not None
    name = f"correctness.{c.dtype}"
    if c.nonfinite:
        return _c(name, Status.FAIL, f"{c.nonfinite} NaN/Inf element(s)", run.gpu, c.nonfinite)
    if c.mismatches:
        reason = f"{c.mismatches} of {c.repeats - 1} repeated products differ bitwise"
        return _c(name, Status.FAIL, reason, run.gpu, c.mismatches)
    if not c.rel_error <= c.tolerance:
        reason = f"relative error {c.rel_error:.2e} against float64 (tolerance {c.tolerance:.0e})"
        return _c(name, Status.FAIL, reason, run.gpu, c.rel_error)
    reason = f"{c.repeats} products bitwise equal; relative error {c.rel_error:.1e}"
    return _c(name, Status.PASS, reason, run.gpu, c.rel_error)


def _sustained(run: DeviceRun, spec: GpuSpec, history: Mapping[str, float]) -> Check:
    s = run.sustained
    assert s is not None
    check = _judge(
        "gemm.bf16.sustained",
        run.gpu,
        s.tflops_median,
        "TFLOP/s",
        reference=None if run.device == "cpu" else peak_tflops(spec, "bf16"),
        what="datasheet peak",
        warn=GEMM_WARN,
        fail=GEMM_FAIL,
        history=history.get("sustained.bf16"),
    )
    burst = run.tflops("bf16")
    if burst and s.tflops_median < SUSTAINED_DROP_WARN * burst and check.status is Status.PASS:
        reason = f"{check.reason}; {s.tflops_median / burst:.2f} of the burst figure"
        return _c(check.name, Status.WARN, reason, run.gpu, check.value, check.unit)
    return check


def cross_gpu(runs: Sequence[DeviceRun]) -> list[Check]:
    """The same product on every GPU of one model must agree bitwise (REFERENCE 5.7)."""
    digests = {
        r.gpu: (r.correctness.digest, r.info.get("sm_count"))
        for r in runs
        if r.ok and r.correctness is not None and r.gpu is not None
    }
    if len(digests) < 2:
        return []
    common, _ = Counter(digests.values()).most_common(1)[0]
    if len({sm for _, sm in digests.values()}) > 1:
        return [_c("correctness.cross_gpu", Status.SKIP, "GPUs differ in SM count", None)]
    odd = sorted(gpu for gpu, d in digests.items() if d != common)
    if not odd:
        return [_c("correctness.cross_gpu", Status.PASS, f"{len(digests)} GPUs agree", None)]
    return [
        _c("correctness.cross_gpu", Status.WARN, "this GPU's product differs from its peers'", g)
        for g in odd
    ]


def allreduce_checks(
    node: NodeRun, spec: GpuSpec, *, history: Mapping[str, float], timeout_s: float | None
) -> list[Check]:
    """NCCL all-reduce bus bandwidth at 1 GiB against the GPU link (or the host link)."""
    name = "allreduce.busbw"
    if not node.ok:
        if node.timed_out:
            reason = f"all-reduce did not finish within {timeout_s or node.seconds:.0f} s; killed"
        else:
            reason = f"all-reduce failed: {node.error}"
        return [_c(name, Status.FAIL, reason, None)]
    out = []
    if node.sum_correct is False:
        out.append(_c("allreduce.sum", Status.FAIL, "all-reduce returned a wrong sum", None))
    point = node.at(ALLREDUCE_JUDGED_BYTES) or (node.points[-1] if node.points else None)
    if point is None:
        return [*out, _c(name, Status.SKIP, "no sizes measured", None)]
    reference: float | None
    if spec.gpu_link and spec.gpu_link.gbps:
        reference, what = spec.gpu_link.gbps / 2, f"{spec.gpu_link.kind} per direction"
    else:
        reference, what = host_link_peak(spec, None, None), "PCIe per direction"
    check = _judge(
        name,
        None,
        point.busbw_gbps,
        "GB/s",
        reference=reference,
        what=what,
        warn=ALLREDUCE_WARN,
        fail=ALLREDUCE_FAIL,
        history=history.get("allreduce_busbw_gbps"),
    )
    size = f"{_size(point.nbytes)} across {node.world} GPUs: "
    out.append(_c(name, check.status, size + check.reason, None, check.value, check.unit))
    return out
