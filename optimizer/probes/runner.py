"""Runs a probe: NVML before, active probes in subprocesses under hard timeouts while NVML is
sampled, NVML after, then the verdict. The only impure part of the probes besides nvml.py and
the subprocess entry points."""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from optimizer.hardware import FP64_UNITS_MIN_TFLOPS, GpuSpec
from optimizer.probes import deep, verdict
from optimizer.probes.active import CUBLAS_WORKSPACE_CONFIG, GEMM_DTYPES, GIB
from optimizer.probes.nvml import HealthSource, NvmlUnavailable, PynvmlSource, kernel_log_xids
from optimizer.probes.nvml import read_kernel_log as _read_kernel_log
from optimizer.probes.procs import run_children
from optimizer.probes.readings import LoadSample, NodeHealth, XidEvent, summarize
from optimizer.probes.schema import (
    DeviceRun,
    NodeRun,
    ProbeResult,
    device_run_from_report,
    node_run_from_report,
)

# HANDOVER is protocol.HANDOVER_PROBE's word, spelt out: the active subprocesses import this
# package, and the protocol would load pydantic into every one of them.
QUICK, DEEP, HANDOVER = "quick", "deep", "handover"
KINDS = (HANDOVER, QUICK, DEEP)
# Per-subprocess hard limits. Quick: the GPUs run side by side, then the all-reduce, so a node
# finishes in well under 120 s even when one probe has to be killed at 55 s.
DEFAULT_TIMEOUT_S = {HANDOVER: 30.0, QUICK: 55.0, DEEP: 900.0}
SUSTAIN_S = {HANDOVER: 0.0, QUICK: 10.0, DEEP: 60.0}
MEMTEST_FRACTION = {HANDOVER: 0.0, QUICK: 0.0, DEEP: 0.9}
# The handover probe (a type already probed in full): the quick probe's stages in the same
# order, with half the timed GEMMs after the same warm-up and a smaller pinned host buffer,
# and no sustained stage. Absent: active.py's defaults (5 warm-up, 20 timed; fp32 and fp64
# half of that). docs/probes.md, The handover probe.
GEMM_REPEATS = {HANDOVER: 10}
HOST_BYTES = {HANDOVER: 256 << 20}
SAMPLE_INTERVAL_S = 0.1
ACTIVE_MODULE = (sys.executable, "-m", "optimizer.probes.active")


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    """What to run. `None` sizes are chosen from the GPU model."""

    kind: str = QUICK
    timeout_s: float | None = None
    expected_gpus: int | None = None
    history: Mapping[str, float] = field(default_factory=dict)  # metric -> earlier median
    earlier_results: tuple[Mapping[str, Any], ...] = ()  # stored JSON results, any model
    gemm_n: int | None = None
    sustain_s: float | None = None
    copy_bytes: int = GIB
    host_bytes: int | None = None  # None: the kind's (1 GiB; 256 MiB for a handover)
    allreduce_sizes: tuple[int, ...] | None = None
    cpu_n: int = 1024
    visible: str | None = None  # CUDA_VISIBLE_DEVICES; None: every GPU
    python: tuple[str, ...] = ACTIVE_MODULE  # how to start an active-probe subprocess

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown probe kind {self.kind!r} (one of {', '.join(KINDS)})")

    @property
    def limit_s(self) -> float:
        return self.timeout_s or DEFAULT_TIMEOUT_S[self.kind]

    @property
    def pinned_bytes(self) -> int:
        """The pinned host buffer the host-link stage moves."""
        return self.host_bytes or HOST_BYTES.get(self.kind, GIB)


class _Sampler:
    """Samples NVML every SAMPLE_INTERVAL_S on a thread while the active probes run."""

    def __init__(self, source: HealthSource | None, t0: float) -> None:
        self.source, self.t0 = source, t0
        self.samples: list[LoadSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)

    def __enter__(self) -> _Sampler:
        if self.source is not None:
            self._thread.start()
        return self

    def _loop(self) -> None:
        assert self.source is not None
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.samples.extend(self.source.sample(time.monotonic() - self.t0))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def dtypes_for(spec: GpuSpec) -> list[str]:
    """The GEMM dtypes worth timing: those the GPU has units for. A model whose table row has
    no figures at all (A10G, unknown models) gets every dtype but fp64."""
    figures = [spec.tflops_for(d) for d in ("fp32", "tf32", "bf16", "fp16")]
    if not any(figures):
        return ["bf16", "fp16", "tf32", "fp32"]
    fp64 = spec.has_fp64_units or (spec.tflops.fp64_tensor or 0) >= FP64_UNITS_MIN_TFLOPS
    return [d for d in GEMM_DTYPES if (d == "fp64" and fp64) or (d != "fp64" and _has(spec, d))]


def _has(spec: GpuSpec, dtype: str) -> bool:
    return dtype == "fp32" or spec.tflops_for(dtype) is not None


def gemm_size(spec: GpuSpec, memory_bytes: int | None) -> int:
    """8192 for big GPUs, 4096 for small ones such as T4/L4 (REFERENCE 5.1)."""
    peak = spec.tflops_for("bf16") or spec.tflops_for("fp16") or 0
    gib = (memory_bytes or 0) / GIB or spec.memory_gib
    return 8192 if peak >= 200 or gib >= 40 else 4096


def _child_env(visible: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CUDA_VISIBLE_DEVICES=visible,
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        CUBLAS_WORKSPACE_CONFIG=CUBLAS_WORKSPACE_CONFIG,
        PYTHONUNBUFFERED="1",
    )
    return env


def _open_source(visible: str | None) -> HealthSource:
    return PynvmlSource(visible)


def run_probe(
    options: ProbeOptions,
    *,
    open_source: Callable[[str | None], HealthSource] = _open_source,
    read_kernel_log: Callable[[], str] = _read_kernel_log,
) -> ProbeResult:
    """Run the handover, quick or deep probe on every visible GPU (or the CPU) and judge it
    (one verdict for every kind: a handover just has no sustained figure to judge)."""
    started = datetime.now(UTC)
    t0 = time.monotonic()
    source: HealthSource | None
    try:
        source = open_source(options.visible)
        nvml_error = None
    except NvmlUnavailable as exc:
        source, nvml_error = None, str(exc)
    try:
        return _run(options, source, nvml_error, started, t0, read_kernel_log)
    finally:
        if source is not None:
            source.close()


def _run(
    options: ProbeOptions,
    source: HealthSource | None,
    nvml_error: str | None,
    started: datetime,
    t0: float,
    read_kernel_log: Callable[[], str],
) -> ProbeResult:
    before = source.snapshot() if source is not None else None
    targets = _gpu_targets(before, options)
    host_info: dict[str, Any] = {}
    runs: list[DeviceRun] = []
    node: NodeRun | None = None
    backend = "cuda"
    backend_note = None
    if source is not None:
        source.start_xid_watch()
    with _Sampler(source, t0) as sampler:
        if not targets:
            backend, backend_note, runs, host_info, targets = _host_phase(options)
        if targets:
            runs = _gpu_phase(options, before, targets)
            if len(targets) > 1:
                node = _allreduce_phase(options, targets)
    xids: list[XidEvent] = source.stop_xid_watch() if source is not None else []
    after = source.snapshot() if source is not None else None
    window = time.monotonic() - t0
    if before is not None:
        bus = {_bus(g.pci_bus_id): g.index for g in before.gpus if g.pci_bus_id}
        xids += kernel_log_xids(read_kernel_log(), bus)
    obs = verdict.Observations(
        backend=backend,
        health=before,
        nvml_error=nvml_error,
        health_after=after,
        window_s=window,
        load=summarize(sampler.samples),
        xids=tuple(xids),
        runs=tuple(runs),
        node=node,
        timeout_s=options.limit_s,
        backend_note=backend_note,
    )
    model = _model_name(before, runs)
    history = dict(options.history)
    if model and options.earlier_results:
        history = verdict.history_medians(options.earlier_results, model) | history
    checks = verdict.judge(obs, expected_gpus=options.expected_gpus, history=history)
    info = next((r.info for r in runs if r.info), host_info)
    return ProbeResult(
        kind=options.kind,
        status=verdict.overall(checks),
        started_at=started.isoformat(timespec="seconds"),
        seconds=time.monotonic() - t0,
        backend=backend,
        gpu_model=model,
        expected_gpus=options.expected_gpus,
        host={
            "hostname": platform.node(),
            "python": platform.python_version(),
            "torch": info.get("torch"),
            "torch_cuda": info.get("cuda"),
            "driver": before.driver_version if before else None,
            "cuda_driver": before.cuda_driver_version if before else None,
            "timeout_s": options.limit_s,
        },
        checks=tuple(checks),
        health=before,
        health_after=after,
        load=obs.load,
        xids=obs.xids,
        runs=tuple(runs),
        node=node,
        measured_tflops=verdict.measured_tflops(model, runs),
    )


def _bus(address: str) -> str:
    from optimizer.probes.nvml import bus_key

    return bus_key(address)


def _model_name(health: NodeHealth | None, runs: Sequence[DeviceRun]) -> str | None:
    if health is not None and health.gpus:
        g = health.gpus[0]
        return verdict.gpu_spec(g.name, g.memory_total_bytes).name
    gpu_runs = [r for r in runs if r.gpu is not None and r.name]
    if gpu_runs:
        return verdict.gpu_spec(gpu_runs[0].name, gpu_runs[0].info.get("memory_bytes")).name
    return None


@dataclass(frozen=True, slots=True)
class _Target:
    gpu: int
    visible: str  # the CUDA_VISIBLE_DEVICES entry that selects exactly this GPU
    spec: GpuSpec
    memory_bytes: int | None


def _gpu_targets(health: NodeHealth | None, options: ProbeOptions) -> list[_Target]:
    if health is None:
        return []
    return [
        _Target(
            g.index,
            g.uuid or str(g.index),
            verdict.gpu_spec(g.name, g.memory_total_bytes),
            g.memory_total_bytes,
        )
        for g in health.gpus
        if not g.lost
    ]


def _host_phase(
    options: ProbeOptions,
) -> tuple[str, str | None, list[DeviceRun], dict[str, Any], list[_Target]]:
    """No GPU through NVML: ask torch what it sees; with no CUDA device, time the CPU."""
    argv = [*options.python, "host", "--n", str(options.cpu_n)]
    (outcome,) = run_children([(argv, dict(os.environ))], options.limit_s)
    report = outcome.report or {}
    info = dict(report.get("info") or {})
    if outcome.report is None or report.get("error"):
        note = report.get("error") or outcome.error
        return "none", note, [], info, []
    cuda = int(info.get("cuda_devices") or 0)
    if cuda:  # CUDA without NVML: probe by index, without health readings
        visible = (options.visible or "").split(",") if options.visible else None
        targets = [
            _Target(i, visible[i] if visible else str(i), verdict.gpu_spec(None), None)
            for i in range(cuda)
        ]
        return "cuda", None, [], info, targets
    run = device_run_from_report(report, device="cpu", gpu=None, seconds=outcome.seconds)
    return "cpu", None, [run], info, []


def _gpu_phase(
    options: ProbeOptions, health: NodeHealth | None, targets: Sequence[_Target]
) -> list[DeviceRun]:
    kind = options.kind
    sustain = options.sustain_s if options.sustain_s is not None else SUSTAIN_S[kind]
    commands = []
    for t in targets:
        n = options.gemm_n or gemm_size(t.spec, t.memory_bytes)
        argv = [
            *options.python,
            "gpu",
            "--n",
            str(n),
            "--dtypes",
            *dtypes_for(t.spec),
            "--copy-bytes",
            str(options.copy_bytes),
            "--host-bytes",
            str(options.pinned_bytes),
            "--sustain-s",
            str(sustain),
            "--memtest-fraction",
            str(MEMTEST_FRACTION[kind]),
        ]
        if kind in GEMM_REPEATS:
            argv += ["--repeats", str(GEMM_REPEATS[kind])]
        commands.append((argv, _child_env(t.visible)))
    outcomes = run_children(commands, options.limit_s)
    runs = []
    for t, o in zip(targets, outcomes, strict=True):
        if o.report is None:
            runs.append(
                DeviceRun("cuda", t.gpu, False, o.seconds, error=o.error, timed_out=o.timed_out)
            )
        else:
            runs.append(
                device_run_from_report(o.report, device="cuda", gpu=t.gpu, seconds=o.seconds)
            )
    return runs


def _allreduce_phase(options: ProbeOptions, targets: Sequence[_Target]) -> NodeRun:
    """One process per GPU, rendezvous through a file (no port to collide on)."""
    world = len(targets)
    sizes = options.allreduce_sizes or (deep.SWEEP_SIZES if options.kind == DEEP else (GIB,))
    visible = ",".join(t.visible for t in targets)
    with tempfile.TemporaryDirectory(prefix="gpuopt-nccl-") as tmp:
        init = f"file://{tmp}/rendezvous"
        commands = []
        for rank in range(world):
            argv = [
                *options.python,
                "allreduce",
                "--rank",
                str(rank),
                "--world",
                str(world),
                "--init",
                init,
                "--sizes",
                *map(str, sizes),
            ]
            commands.append((argv, _child_env(visible)))
        outcomes = run_children(commands, options.limit_s)
    seconds = max(o.seconds for o in outcomes)
    failed = [o for o in outcomes if o.report is None or o.report.get("error")]
    if failed:
        first = failed[0]
        error = first.error or (first.report or {}).get("error")
        timed_out = any(o.timed_out for o in outcomes)
        return NodeRun(world, False, seconds, error=error, timed_out=timed_out)
    return node_run_from_report(outcomes[0].report or {}, world=world, seconds=seconds)
