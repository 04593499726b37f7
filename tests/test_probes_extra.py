"""The `probes` extra brings everything torch needs to import quietly: without numpy, every
import of torch warns "Failed to initialize NumPy" on stderr, which lands in every job log."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WARNING = "Failed to initialize NumPy"

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def test_the_probes_extra_lists_numpy_next_to_torch() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {
        re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower()
        for r in project["optional-dependencies"]["probes"]
    }
    assert {"torch", "numpy"} <= names


@needs_torch
def test_the_probes_torch_path_imports_without_the_numpy_warning() -> None:
    code = (
        "from optimizer.probes.tensors import load_torch, random_matrix\n"
        "m = random_matrix('cpu', 8, load_torch().float32, 0)\n"
        "print(tuple(m.shape))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(8, 8)"
    assert WARNING not in done.stderr, done.stderr


@needs_torch
@pytest.mark.slow
def test_the_example_jobs_output_has_no_numpy_warning(tmp_path: Path) -> None:
    env = {**os.environ, "GPUOPT_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_with_checkpoints.py"), "--steps", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "finished: 1/1 steps" in done.stdout
    assert WARNING not in done.stdout + done.stderr, done.stderr
