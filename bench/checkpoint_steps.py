"""A training step's time while the agent's uploader ships a checkpoint, on a GPU machine.

The job's steps (bf16 matrix products on the GPU, synchronised after each, about `--step-ms`
long) are timed alone, then while a child process does what the agent does with a committed
checkpoint of `--gib` GiB in `--files` files: hash every file (sha256) and copy it to the
store through `optimizer.checkpoints.Uploader` (8 files' parts at a time), manifest last. The
store is a `file://` bucket on the same machine's disk, so what competes with the job is the
agent's own work (reading, hashing, writing), not a network: on a cloud the copy goes to
S3 or GCS instead, with the same hashing and reading on the instance.

    PYTHONPATH=. python bench/checkpoint_steps.py --gib 4 --repeats 3 --out results.json

Prints one line per run and writes the figures as JSON (`--out`); p99 slowdown is the
issue's goal (at most 5%). Needs torch with a GPU (`--device cpu` runs it without one); run from the
project's root with it on `PYTHONPATH` where gpuopt is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def make_checkpoint(local: Path, gib: float, files: int) -> None:
    from optimizer.checkpoints import commit

    folder = local / "step-1"
    folder.mkdir(parents=True)
    each = int(gib * 1024 * MIB / files)
    block = os.urandom(8 * MIB)
    for i in range(files):
        with open(folder / f"shard-{i}.bin", "wb") as f:
            left = each
            while left > 0:
                f.write(block[: min(left, len(block))])
                left -= len(block)
    commit(folder, 1)


def upload_child(local: str, uri: str) -> None:
    """The agent's part: upload every committed folder now, manifest last."""
    from optimizer.checkpoints import Uploader
    from optimizer.storage import open_store

    started = time.monotonic()
    up = Uploader(open_store(uri), Path(local), keep=3, on_commit=lambda c: None)
    commits = up.start().flush(3600)
    up.stop()
    seconds = time.monotonic() - started
    size = sum(c.size_bytes for c in commits)
    print(json.dumps({"seconds": seconds, "mib_s": size / MIB / seconds, "bytes": size}))


def calibrate(device: str, target_ms: float) -> tuple[int, Any]:
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n = 1024
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)

        def step(a: Any = a, b: Any = b) -> None:
            for _ in range(8):
                (a @ b).sum()
            if device == "cuda":
                torch.cuda.synchronize()

        for _ in range(3):
            step()
        started = time.perf_counter()
        for _ in range(5):
            step()
        ms = (time.perf_counter() - started) / 5 * 1000
        if ms >= target_ms or n >= 32768:
            return n, step
        n = int(n * min(2.0, max(1.1, (target_ms / max(ms, 0.01)) ** (1 / 3))))


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "steps": len(times),
        "p50_ms": round(at(0.50) * 1000, 3),
        "p99_ms": round(at(0.99) * 1000, 3),
        "mean_ms": round(statistics.fmean(times) * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


def one_run(root: Path, step: Any, args: argparse.Namespace) -> dict[str, Any]:
    local, bucket = root / "local", root / "bucket"
    shutil.rmtree(local, ignore_errors=True)
    shutil.rmtree(bucket, ignore_errors=True)
    make_checkpoint(local, args.gib, args.files)
    alone = []
    for _ in range(args.base_steps):
        started = time.perf_counter()
        step()
        alone.append(time.perf_counter() - started)
    child = subprocess.Popen(
        [sys.executable, __file__, "--upload-child", str(local), f"file://{bucket}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    during = []
    while child.poll() is None:
        started = time.perf_counter()
        step()
        during.append(time.perf_counter() - started)
    out, _ = child.communicate()
    upload = json.loads(out.strip().splitlines()[-1])
    a, d = summary(alone), summary(during)
    return {
        "alone": a,
        "uploading": d,
        "p50_slowdown_pct": round((d["p50_ms"] / a["p50_ms"] - 1) * 100, 2),
        "p99_slowdown_pct": round((d["p99_ms"] / a["p99_ms"] - 1) * 100, 2),
        "upload_s": round(upload["seconds"], 2),
        "upload_mib_s": round(upload["mib_s"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base-steps", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=30.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--upload-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upload_child:
        upload_child(*args.upload_child)
        return
    import torch

    n, step = calibrate(args.device, args.step_ms)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    result: dict[str, Any] = {
        "device": name,
        "cpus": os.cpu_count(),
        "step": f"8 products of {n}x{n} matrices on {args.device}, synchronised",
        "checkpoint": f"{args.gib:g} GiB in {args.files} files, to a file:// bucket on disk",
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="gpuopt-steps-") as tmp:
        for repeat in range(args.repeats):
            run = one_run(Path(tmp), step, args)
            result["runs"].append(run)
            print(
                f"run {repeat + 1}: alone p50 {run['alone']['p50_ms']} p99 "
                f"{run['alone']['p99_ms']} ms; uploading p50 {run['uploading']['p50_ms']} p99 "
                f"{run['uploading']['p99_ms']} ms ({run['uploading']['steps']} steps); "
                f"p99 {run['p99_slowdown_pct']:+}%; upload {run['upload_mib_s']} MiB/s",
                flush=True,
            )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
