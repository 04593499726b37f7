"""Policy files for tests: a small policy's text, and writing a file the watcher notices."""

from __future__ import annotations

import os
from pathlib import Path


def policy_text(name: str = "small", *, cap: float | None = None, memory: float = 16) -> str:
    """A one-GPU policy on spot or on-demand; `cap` sets its bid ceiling in $/h."""
    bid = f"bid: {{max_usd_per_hour: {cap}}}\n" if cap is not None else ""
    return (
        "apiVersion: gpuopt/v1\n"
        "kind: Policy\n"
        f"name: {name}\n"
        "workload:\n"
        "  gpus: 1\n"
        f"  gpu_memory_gib: {memory}\n"
        "markets: [spot, on_demand]\n"
        f"{bid}"
    )


def write_policy(directory: Path, filename: str, text: str) -> Path:
    """Write a policy file so the watcher sees a change even within one mtime tick: a rewrite
    that kept the old modification time gets one a millisecond later."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    before = path.stat().st_mtime_ns if path.exists() else None
    path.write_text(text, encoding="utf-8")
    if before is not None and path.stat().st_mtime_ns <= before:
        stamp = before + 1_000_000
        os.utime(path, ns=(stamp, stamp))
    return path
