"""The active probes on the CPU with small sizes, and the subprocess machinery around them:
a probe that hangs is killed at its timeout and reported failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer.probes import (
    GpuHealth,
    NodeHealth,
    NvmlUnavailable,
    ProbeOptions,
    Status,
    XidEvent,
    run_children,
    run_probe,
)
from optimizer.probes.readings import LoadSample

torch = pytest.importorskip("torch")

from optimizer.probes import active, deep  # noqa: E402  (after the torch skip)

BLOCK = (sys.executable, "-c", "import signal; signal.pause()")  # never returns by itself


def test_cpu_gemm_reports_a_positive_median_within_its_spread() -> None:
    stat = active.gemm("cpu", "fp32", 64, warmup=1, repeats=5)
    assert stat.n == 64 and stat.repeats == 5
    assert 0 < stat.tflops_min <= stat.tflops <= stat.tflops_max


def test_cpu_bf16_gemm_runs() -> None:
    assert active.gemm("cpu", "bf16", 64, warmup=1, repeats=3).tflops > 0


def test_correctness_on_the_cpu_is_bitwise_stable_and_close_to_float64() -> None:
    result = active.correctness("cpu", 96, repeats=3)
    assert (result.mismatches, result.nonfinite) == (0, 0)
    assert result.rel_error < 1e-5
    assert result.digest == active.correctness("cpu", 96, repeats=2).digest


def test_fingerprint_sees_one_flipped_bit() -> None:
    a = torch.randn(32, 32)
    b = a.clone()
    b.view(torch.int32)[3, 4] ^= 1
    assert active.fingerprint(a) == active.fingerprint(a.clone())
    assert active.fingerprint(a) != active.fingerprint(b)


def test_memory_pattern_test_reads_back_what_it_wrote() -> None:
    result = deep.memory_test("cpu", chunk_bytes=1 << 20, max_bytes=4 << 20)
    assert result.bytes_tested == 4 << 20
    assert (result.patterns, result.mismatches) == (len(deep.PATTERNS), 0)


def test_sustained_gemm_reports_windows() -> None:
    result = deep.sustained_gemm("cpu", 64, seconds=0.05)
    assert result.windows >= 1 and result.tflops_median > 0


def test_host_task_writes_cpu_figures_from_a_subprocess(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    done = subprocess.run(
        [sys.executable, "-m", "optimizer.probes.active", "host", "--n", "64", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["info"]["cuda_available"] is False
    assert {g["dtype"] for g in report["gemm"]} >= {"fp32"}
    assert report["correctness"]["mismatches"] == 0


# --- timeouts --------------------------------------------------------------------------------


def test_a_hanging_subprocess_is_killed_at_its_timeout() -> None:
    (outcome,) = run_children([(BLOCK, dict(os.environ))], timeout_s=0.5)
    assert outcome.timed_out and outcome.report is None


def test_a_crashing_subprocess_is_reported_with_its_last_words() -> None:
    crash = (sys.executable, "-c", "raise SystemExit('cuda init failed')")
    (outcome,) = run_children([(crash, dict(os.environ))], timeout_s=30)
    assert not outcome.timed_out
    assert outcome.error is not None and "cuda init failed" in outcome.error


class OneGpu:
    """A HealthSource with one healthy H200 and nothing to report under load."""

    def __init__(self, visible: str | None) -> None:
        self.visible = visible

    def snapshot(self) -> NodeHealth:
        gpu = GpuHealth(0, name="NVIDIA H200", uuid="GPU-x", memory_total_bytes=150_754_820_096)
        return NodeHealth(gpus=(gpu,), device_count=1)

    def sample(self, t: float) -> list[LoadSample]:
        return []

    def start_xid_watch(self) -> None:
        pass

    def stop_xid_watch(self) -> list[XidEvent]:
        return []

    def close(self) -> None:
        pass


def test_a_probe_that_hangs_fails_the_run() -> None:
    options = ProbeOptions(timeout_s=0.5, python=BLOCK)
    result = run_probe(options, open_source=OneGpu, read_kernel_log=str)
    assert result.status is Status.FAIL
    (hung,) = [c for c in result.checks if c.name == "probe.active"]
    assert hung.status is Status.FAIL and "killed" in hung.reason
    assert result.runs[0].timed_out


def no_nvml(visible: str | None) -> OneGpu:
    raise NvmlUnavailable("NVML Shared Library Not Found")


def test_without_cuda_the_probe_times_the_cpu_and_says_so() -> None:
    options = ProbeOptions(cpu_n=64, timeout_s=120)
    result = run_probe(options, open_source=no_nvml, read_kernel_log=str)
    assert result.backend == "cpu"
    assert result.status is Status.WARN
    (finding,) = [c for c in result.checks if c.name == "cuda"]
    assert "no CUDA device" in finding.reason
    assert result.measured_tflops["cpu"]["fp32"] > 0
    data = json.loads(json.dumps(result.to_dict()))
    assert data["runs"][0]["device"] == "cpu" and data["gpu_model"] is None
