"""The probe result: checks with pass/warn/fail, the measurements behind them, and its JSON form.

The JSON layout is versioned (`schema` + `version`) and documented in docs/probes.md. A reader
must ignore keys it does not know; a change that removes or renames a key bumps the version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from optimizer.probes.readings import LoadSummary, NodeHealth, XidEvent

SCHEMA_ID = "gpuopt.probe"
SCHEMA_VERSION = 1


class Status(StrEnum):
    """A check's outcome. `skip`: not applicable or not measured here; never sick."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


_RANK = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3}


def worst(statuses: Iterable[Status]) -> Status:
    """The overall outcome: fail over warn over pass; skips count as pass."""
    found = max((_RANK[s] for s in statuses), default=1)
    return Status.PASS if found <= 1 else (Status.WARN if found == 2 else Status.FAIL)


@dataclass(frozen=True, slots=True)
class Check:
    """One judged fact. `name` is dotted (`ecc.volatile_uncorrected`); `gpu` is None node-wide."""

    name: str
    status: Status
    reason: str
    gpu: int | None = None
    value: float | None = None
    unit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu": self.gpu,
            "status": self.status.value,
            "reason": self.reason,
            "value": self.value,
            "unit": self.unit,
        }


# --- measurements (what an active-probe subprocess reports) -----------------------------------


@dataclass(frozen=True, slots=True)
class GemmStat:
    """Dense matmul throughput for one dtype: 2*n^3 FLOP per product, over the timed repeats."""

    dtype: str
    n: int
    tflops: float  # median
    tflops_min: float
    tflops_max: float
    repeats: int


@dataclass(frozen=True, slots=True)
class Correctness:
    """Repeated products compared bitwise with the first, and with a float64 reference."""

    dtype: str
    n: int
    repeats: int
    mismatches: int  # products that differ bitwise from the first
    nonfinite: int  # NaN/Inf elements in any product
    rel_error: float  # ||C - ref|| / ||ref|| on the rows checked against float64
    tolerance: float
    digest: str  # sha256 of the first product's bytes, for the cross-GPU compare


@dataclass(frozen=True, slots=True)
class Sustained:
    """A sustained bf16 GEMM load (deep probe): throughput per ~1 s window."""

    seconds: float
    tflops_median: float
    tflops_min: float
    windows: int


@dataclass(frozen=True, slots=True)
class MemTest:
    """A write-then-verify pattern test over most of the free device memory (deep probe)."""

    bytes_tested: int
    patterns: int
    mismatches: int  # 8-byte words that read back wrong, over all patterns
    seconds: float


@dataclass(frozen=True, slots=True)
class AllReducePoint:
    """NCCL all-reduce at one size: busbw = algbw x 2(n-1)/n (nccl-tests PERFORMANCE.md)."""

    nbytes: int
    time_ms: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True, slots=True)
class DeviceRun:
    """One device's active probe, as its subprocess reported it (or failed to)."""

    device: str  # "cuda" or "cpu"
    gpu: int | None  # index among the probed GPUs; None for the CPU
    ok: bool
    seconds: float
    error: str | None = None
    timed_out: bool = False
    name: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict)  # torch/CUDA versions, SMs, threads
    gemm: tuple[GemmStat, ...] = ()
    copy_gbps: float | None = None  # device-to-device, bytes read + written
    h2d_gbps: float | None = None  # pinned host memory
    d2h_gbps: float | None = None
    correctness: Correctness | None = None
    sustained: Sustained | None = None
    memtest: MemTest | None = None

    def tflops(self, dtype: str) -> float | None:
        return next((g.tflops for g in self.gemm if g.dtype == dtype), None)


@dataclass(frozen=True, slots=True)
class NodeRun:
    """The node-wide NCCL all-reduce probe (more than one GPU)."""

    world: int
    ok: bool
    seconds: float
    error: str | None = None
    timed_out: bool = False
    points: tuple[AllReducePoint, ...] = ()
    sum_correct: bool | None = None

    def at(self, nbytes: int) -> AllReducePoint | None:
        return next((p for p in self.points if p.nbytes == nbytes), None)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def device_run_from_report(
    report: Mapping[str, Any], *, device: str, gpu: int | None, seconds: float
) -> DeviceRun:
    """A DeviceRun from the JSON an active-probe subprocess wrote (see active.py)."""
    corr = report.get("correctness")
    sus = report.get("sustained")
    mem = report.get("memtest")
    return DeviceRun(
        device=device,
        gpu=gpu,
        ok=report.get("error") is None,
        seconds=seconds,
        error=report.get("error"),
        name=report.get("name"),
        info=dict(report.get("info") or {}),
        gemm=tuple(GemmStat(**g) for g in report.get("gemm") or ()),
        copy_gbps=_opt_float(report.get("copy_gbps")),
        h2d_gbps=_opt_float(report.get("h2d_gbps")),
        d2h_gbps=_opt_float(report.get("d2h_gbps")),
        correctness=Correctness(**corr) if corr else None,
        sustained=Sustained(**sus) if sus else None,
        memtest=MemTest(**mem) if mem else None,
    )


def node_run_from_report(report: Mapping[str, Any], *, world: int, seconds: float) -> NodeRun:
    """A NodeRun from the all-reduce subprocess's JSON."""
    return NodeRun(
        world=world,
        ok=report.get("error") is None,
        seconds=seconds,
        error=report.get("error"),
        points=tuple(AllReducePoint(**p) for p in report.get("points") or ()),
        sum_correct=report.get("sum_correct"),
    )


def _plain(value: Any) -> Any:
    """Dataclass trees to JSON-ready values."""
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, StrEnum):
        return value.value
    return value


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Everything one `gpuopt probe` run found. `to_dict` is the documented JSON."""

    kind: str  # "handover", "quick" or "deep"
    status: Status
    started_at: str  # ISO 8601, UTC
    seconds: float
    backend: str  # "cuda", "cpu" (no CUDA device), or "none" (no torch)
    gpu_model: str | None  # canonical hardware-table name, or "unknown:<name>"
    expected_gpus: int | None
    host: Mapping[str, Any]
    checks: tuple[Check, ...]
    health: NodeHealth | None = None
    health_after: NodeHealth | None = None
    load: Mapping[int, LoadSummary] = field(default_factory=dict)
    xids: tuple[XidEvent, ...] = ()
    runs: tuple[DeviceRun, ...] = ()
    node: NodeRun | None = None
    measured_tflops: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_ID,
            "version": SCHEMA_VERSION,
            "kind": self.kind,
            "status": self.status.value,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 3),
            "backend": self.backend,
            "gpu_model": self.gpu_model,
            "expected_gpus": self.expected_gpus,
            "host": dict(self.host),
            "checks": [c.to_dict() for c in self.checks],
            "measured_tflops": _plain(self.measured_tflops),
            "runs": [_plain(r) for r in self.runs],
            "node": _plain(self.node) if self.node else None,
            "health": self.health.to_dict() if self.health else None,
            "health_after": self.health_after.to_dict() if self.health_after else None,
            "load": {str(k): v.to_dict() for k, v in sorted(self.load.items())},
            "xids": [_plain(x) for x in self.xids],
        }

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        out = {s.value: 0 for s in Status}
        for c in self.checks:
            out[c.status.value] += 1
        return out
