"""The agent's GPU telemetry sampler beside a real training loop, on one GPU.

Starts `optimizer.agent.telemetry.TelemetrySampler` on NVML (10 s readings, per-minute
aggregates) before CUDA is touched, then trains a bf16 MLP (GEMM-heavy: 8192-wide layers,
batch 8192, AdamW) for --seconds with --ballast-gib of extra memory held. Afterwards it
compares each minute that lies wholly inside the training window with what the loop did:
utilization against --min-util, and NVML's peak memory used (less what was used before CUDA
started) against the memory PyTorch reserved, within --memory-tolerance.

    python3 -m bench.telemetry --seconds 130 --out bench/results/telemetry_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from optimizer.agent.telemetry import GIB, TelemetrySampler, open_nvml


def train(seconds: float, ballast_gib: float) -> dict[str, Any]:
    import torch

    dev = torch.device("cuda")
    ballast = torch.empty(int(ballast_gib * GIB), dtype=torch.uint8, device=dev)
    ballast.fill_(1)
    width, depth, batch = 8192, 6, 8192
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width, bias=False), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=dev, dtype=torch.bfloat16)
    target = torch.randn(batch, width, device=dev, dtype=torch.bfloat16)
    steps = 0
    started = datetime.now(UTC)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(10):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            steps += 1
        torch.cuda.synchronize()  # once per 10 steps: the queue stays full
    elapsed = time.monotonic() - t0
    ended = datetime.now(UTC)
    flop = steps * depth * 3 * 2 * batch * width * width  # forward + two backward GEMMs
    out = {
        "started": started.isoformat(),
        "ended": ended.isoformat(),
        "steps": steps,
        "seconds": round(elapsed, 2),
        "gemm_tflops": round(flop / elapsed / 1e12, 1),
        "loss": float(loss.item()),
        "torch_allocated_peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
        "torch_reserved_gib": round(torch.cuda.memory_reserved() / GIB, 3),
        "ballast_gib": ballast_gib,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    del ballast
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=130.0)
    ap.add_argument("--ballast-gib", type=float, default=64.0)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--min-util", type=float, default=0.90)
    ap.add_argument("--memory-tolerance", type=float, default=0.05)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    source = open_nvml()
    if source is None:
        print("NVML cannot start here: no GPU telemetry", file=sys.stderr)
        return 2
    baseline = source.read()
    baseline_gib = sum(r.memory_used_bytes or 0 for r in baseline) / GIB
    minutes: list[dict[str, Any]] = []
    sampler = TelemetrySampler(source, minutes.extend, interval_s=args.interval)
    sampler.start()
    run = train(args.seconds, args.ballast_gib)
    sampler.stop(flush=True)

    started = datetime.fromisoformat(run["started"])
    ended = datetime.fromisoformat(run["ended"])
    inside = [
        m
        for m in minutes
        if datetime.fromisoformat(m["start"].replace("Z", "+00:00")) >= started
        and datetime.fromisoformat(m["start"].replace("Z", "+00:00")) + timedelta(minutes=1)
        <= ended
    ]
    expected_gib = run["torch_reserved_gib"]
    checks = []
    for m in inside:
        used = m["memory_used_gib_max"] - baseline_gib
        checks.append(
            {
                "start": m["start"],
                "samples": m["samples"],
                "util_mean": m["util_mean"],
                "util_ok": m["util_mean"] is not None and m["util_mean"] > args.min_util,
                "memory_used_gib": round(used, 3),
                "memory_ratio_to_reserved": round(used / expected_gib, 4),
                "memory_ok": abs(used / expected_gib - 1) <= args.memory_tolerance,
            }
        )
    result = {
        "what": "agent NVML sampler (10 s readings, per-minute aggregates) during bf16 training",
        "interval_s": args.interval,
        "baseline_memory_used_gib": round(baseline_gib, 3),
        "run": run,
        "minutes": minutes,
        "full_minutes_inside_training": checks,
        "pass": bool(checks) and all(c["util_ok"] and c["memory_ok"] for c in checks),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
