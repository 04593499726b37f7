"""The probes on a real NVIDIA GPU. Marked `gpu`; skipped where CUDA is absent."""

from __future__ import annotations

import os

import pytest

from optimizer.probes import ProbeOptions, Status, run_probe


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA device")]


def test_gemm_on_the_gpu_is_timed_with_events() -> None:
    from optimizer.probes import active

    stat = active.gemm("cuda:0", "bf16", 2048, warmup=2, repeats=5)
    assert stat.tflops > 1


def test_correctness_is_bitwise_on_the_gpu() -> None:
    from optimizer.probes import active

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", active.CUBLAS_WORKSPACE_CONFIG)
    result = active.correctness("cuda:0", 1024, repeats=4)
    assert (result.mismatches, result.nonfinite) == (0, 0)
    assert result.rel_error < result.tolerance


def test_quick_probe_on_the_first_gpu_passes_or_warns() -> None:
    options = ProbeOptions(visible="0", gemm_n=4096, sustain_s=1, copy_bytes=1 << 28)
    result = run_probe(options)
    failed = [c for c in result.checks if c.status is Status.FAIL]
    assert result.backend == "cuda" and not failed, failed
