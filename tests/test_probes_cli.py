"""`gpuopt probe` as users run it, and the import rule (no torch/pynvml for the verdict)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def gpuopt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def test_importing_the_probes_loads_neither_torch_nor_pynvml() -> None:
    code = (
        "import sys, optimizer.probes, optimizer.cli.probe\n"
        "print([m for m in ('torch', 'pynvml') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("kinds", [("--quick", "--deep"), ("--handover", "--quick")])
def test_two_kinds_together_is_bad_usage(kinds: tuple[str, str]) -> None:
    done = gpuopt("probe", *kinds)
    assert done.returncode == 2
    assert "exclude each other" in done.stderr


def test_negative_timeout_is_bad_usage() -> None:
    assert gpuopt("probe", "--timeout", "0").returncode == 2


@pytest.mark.skipif(
    subprocess.run(
        [sys.executable, "-c", "import torch; assert not torch.cuda.is_available()"],
        capture_output=True,
        check=False,
    ).returncode
    != 0,
    reason="needs torch and no CUDA device",
)
def test_probe_without_a_gpu_reports_cpu_figures_and_fails_an_expected_gpu() -> None:
    done = gpuopt("probe", "--json", "--expect-gpus", "1")
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert (data["schema"], data["version"], data["backend"]) == ("gpuopt.probe", 1, "cpu")
    assert data["status"] == "fail"
    count = next(c for c in data["checks"] if c["name"] == "gpu.count")
    assert count["status"] == "fail" and "found no CUDA device" in count["reason"]
    assert {"fp32"} <= set(data["measured_tflops"]["cpu"])
