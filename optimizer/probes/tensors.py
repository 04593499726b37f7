"""Torch helpers the active and deep probes share: loading torch, dtypes, inputs, syncs.

Torch is imported inside each call, so importing this module (or the probes) costs nothing;
only the probe subprocesses call these.
"""

from __future__ import annotations

from typing import Any

GIB = 1 << 30


def load_torch() -> Any:
    import torch

    return torch


def torch_dtype(name: str) -> Any:
    """The torch dtype of a probe dtype name; tf32 runs on float32 inputs."""
    torch = load_torch()
    return {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "tf32": torch.float32,
        "fp32": torch.float32,
        "fp64": torch.float64,
    }[name]


def sync(device: str) -> None:
    """Wait for the device's queued work (CPU work is synchronous already)."""
    if device.startswith("cuda"):
        load_torch().cuda.synchronize(device)


def random_matrix(device: str, n: int, dtype: Any, seed: int) -> Any:
    """A seeded n x n normal matrix of `dtype` on `device`."""
    torch = load_torch()
    gen = torch.Generator(device=device).manual_seed(seed)
    base = torch.float64 if dtype == torch.float64 else torch.float32
    # Random, never zeros: zeros run faster and hide wrong results (REFERENCE 5.1).
    return torch.randn(n, n, device=device, dtype=base, generator=gen).to(dtype)
