"""Active probes: timed GEMMs, copies, host-link transfers, a correctness burn and all-reduce.

Each function runs on one torch device ("cuda:0", "cpu") and imports torch itself, so importing
this module costs nothing. The runner never calls them in its own process: it starts
`python -m optimizer.probes.active TASK ...` under a hard timeout (a hang is a symptom, e.g.
XID 79), and the subprocess writes one JSON object to `--out`. Method: REFERENCE 5.1 (CUDA
events after warm-up, median of repeats, 2*n^3 FLOP, copies count bytes read + written).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any

from optimizer.probes import deep
from optimizer.probes.schema import AllReducePoint, Correctness, GemmStat
from optimizer.probes.tensors import GIB, load_torch, random_matrix, sync, torch_dtype

# Bitwise-reproducible cuBLAS needs this set before CUDA starts (cuBLAS docs, reproducibility).
CUBLAS_WORKSPACE_CONFIG = ":4096:8"
# gpu-burn's tolerance for fp32 products (wilicc/gpu-burn compare.cu); float32 normally lands
# far below it (REFERENCE 5.1), so a product above it is wrong, not imprecise.
FP32_REL_TOLERANCE = 1e-3
REFERENCE_ROWS = 256  # rows of the first product checked against a float64 CPU reference
GEMM_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64")


def set_tf32(enabled: bool) -> None:
    """TF32 for float32 CUDA matmuls: explicit, since the default changed across torch versions."""
    matmul = load_torch().backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; allow_tf32 is on its way out
        matmul.fp32_precision = "tf32" if enabled else "ieee"
    else:
        matmul.allow_tf32 = enabled


def time_each(device: str, fn: Callable[[], object], repeats: int, budget_s: float) -> list[float]:
    """Seconds per call for `repeats` calls (fewer, but >= 3, if `budget_s` runs out first).

    On CUDA each call sits between its own pair of events, recorded back to back and read after
    one synchronize, so the host never stalls the queue. On the CPU calls are synchronous.
    """
    torch = load_torch()
    if device.startswith("cuda"):
        pairs = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        pairs[-1][1].synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in pairs]
    times: list[float] = []
    began = time.perf_counter()
    for i in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if i >= 2 and time.perf_counter() - began > budget_s:
            break
    return times


def gemm(
    device: str,
    dtype: str,
    n: int,
    *,
    warmup: int = 5,
    repeats: int = 20,
    budget_s: float = 2.0,
    seed: int = 0,
) -> GemmStat:
    """Dense n x n x n matmul throughput (TFLOP/s, median) for one dtype; tf32 = fp32 inputs."""
    torch = load_torch()
    if device.startswith("cuda"):
        set_tf32(dtype == "tf32")
    dt = torch_dtype(dtype)
    a = random_matrix(device, n, dt, seed)
    b = random_matrix(device, n, dt, seed + 1)
    c = torch.empty(n, n, device=device, dtype=dt)  # preallocated: no allocation is timed
    for _ in range(warmup):
        torch.mm(a, b, out=c)
    sync(device)
    times = time_each(device, lambda: torch.mm(a, b, out=c), repeats, budget_s)
    flop = 2.0 * n**3
    rates = sorted(flop / t / 1e12 for t in times)
    if device.startswith("cuda"):
        set_tf32(False)
    return GemmStat(
        dtype=dtype,
        n=n,
        tflops=statistics.median(rates),
        tflops_min=rates[0],
        tflops_max=rates[-1],
        repeats=len(rates),
    )


def copy_bandwidth(device: str, nbytes: int = GIB, *, warmup: int = 3, repeats: int = 20) -> float:
    """Device-to-device copy, GB/s counting bytes read plus bytes written (2 x nbytes)."""
    torch = load_torch()
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    sync(device)
    times = time_each(device, lambda: dst.copy_(src), repeats, budget_s=5.0)
    return 2 * nbytes / statistics.median(times) / 1e9


def host_bandwidth(
    device: str, nbytes: int = GIB, *, warmup: int = 2, repeats: int = 10
) -> tuple[float, float]:
    """(host-to-device, device-to-host) GB/s through pinned host memory, bytes moved once."""
    torch = load_torch()
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = []
    for fn in (
        lambda: dev.copy_(host, non_blocking=True),
        lambda: host.copy_(dev, non_blocking=True),
    ):
        for _ in range(warmup):
            fn()
        sync(device)
        times = time_each(device, fn, repeats, budget_s=5.0)
        out.append(nbytes / statistics.median(times) / 1e9)
    return out[0], out[1]


def fingerprint(t: Any) -> str:
    """An exact, order-sensitive fingerprint of a tensor's bits (no numpy needed)."""
    torch = load_torch()
    words = t.contiguous().view(torch.int32).flatten().to(torch.int64)
    weights = torch.arange(words.numel(), device=t.device, dtype=torch.int64) * 2654435761 + 1
    return f"{int((words * weights).sum()) & (2**64 - 1):016x}"


def correctness(device: str, n: int, *, repeats: int = 10, seed: int = 7) -> Correctness:
    """gpu-burn style: the same fp32 product `repeats` times, each compared bitwise with the
    first, none non-finite, and the first within tolerance of a float64 CPU reference."""
    torch = load_torch()
    if device.startswith("cuda"):
        set_tf32(False)
    # Inputs drawn on the CPU so every GPU multiplies exactly the same matrices.
    gen = torch.Generator().manual_seed(seed)
    a_cpu = torch.randn(n, n, generator=gen)
    b_cpu = torch.randn(n, n, generator=gen)
    a, b = a_cpu.to(device), b_cpu.to(device)
    outs = [torch.empty(n, n, device=device) for _ in range(repeats)]
    for c in outs:
        torch.mm(a, b, out=c)
    sync(device)
    first = outs[0]
    mismatches = sum(0 if torch.equal(c, first) else 1 for c in outs[1:])
    nonfinite = sum(int((~torch.isfinite(c)).sum()) for c in outs)
    rows = min(n, REFERENCE_ROWS)
    ref = a_cpu[:rows].double() @ b_cpu.double()
    got = first[:rows].double().cpu()
    rel = float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref))
    if rel != rel:  # NaN
        rel = float("inf")
    return Correctness(
        dtype="fp32",
        n=n,
        repeats=repeats,
        mismatches=mismatches,
        nonfinite=nonfinite,
        rel_error=rel,
        tolerance=FP32_REL_TOLERANCE,
        digest=fingerprint(first),
    )


def device_info(device: str) -> dict[str, Any]:
    """Versions and the device's own description (as torch sees it)."""
    torch = load_torch()
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name,
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
            memory_bytes=props.total_memory,
            uuid=str(getattr(props, "uuid", "")) or None,
        )
    return info


def allreduce(
    rank: int, world: int, init: str, sizes: Sequence[int], *, warmup: int = 5, repeats: int = 20
) -> dict[str, Any]:
    """NCCL all-reduce bus bandwidth per size, one process per GPU (this one is `rank`).

    Time per operation is each rank's median; the slowest rank's counts (a collective is as
    fast as its slowest member). Returns the report on rank 0, {} elsewhere.
    """
    torch = load_torch()
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = f"cuda:{rank}"
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    try:
        probe = torch.full((1024,), float(rank + 1), device=dev)
        dist.all_reduce(probe)
        sum_ok = bool(torch.all(probe == world * (world + 1) / 2))
        points = []
        for nbytes in sizes:
            x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
            for _ in range(warmup):
                dist.all_reduce(x)
            torch.cuda.synchronize(dev)
            t = statistics.median(time_each(dev, partial(dist.all_reduce, x), repeats, 60.0))
            slowest = torch.tensor([t], device=dev, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            t = float(slowest.item())
            algbw = nbytes / t / 1e9
            busbw = algbw * 2 * (world - 1) / world
            points.append(asdict(AllReducePoint(nbytes, t * 1e3, algbw, busbw)))
            del x
        return {"points": points, "sum_correct": sum_ok} if rank == 0 else {}
    finally:
        dist.destroy_process_group()


def _cpu_dtypes_and_gemm(n: int) -> list[dict[str, Any]]:
    out = []
    for dtype in ("fp32", "bf16"):
        try:
            out.append(asdict(gemm("cpu", dtype, n, warmup=1, repeats=10, budget_s=1.0)))
        except (RuntimeError, TypeError):  # bf16 matmul unsupported on this CPU/torch
            continue
    return out


def run_gpu(args: argparse.Namespace) -> dict[str, Any]:
    """The per-GPU probe (this process sees one GPU, cuda:0)."""
    torch = load_torch()
    dev = "cuda:0"
    torch.cuda.set_device(dev)
    report: dict[str, Any] = {"info": device_info(dev)}
    report["name"] = report["info"]["name"]
    stats = []
    for dtype in args.dtypes:
        reps = args.repeats if dtype in ("bf16", "fp16", "tf32") else max(5, args.repeats // 2)
        # fp64 at half size: an 8192^3 fp64 product takes ~20 ms on an H200, so repeats at
        # that size hold the GPU at its power cap, while the reference figure (REFERENCE 5.2,
        # gpu_reference.py) times 4096^3 products; docs/probes.md has both figures.
        n = (args.fp64_n or args.n // 2) if dtype == "fp64" else args.n
        stats.append(asdict(gemm(dev, dtype, n, warmup=args.warmup, repeats=reps)))
    report["gemm"] = stats
    report["copy_gbps"] = copy_bandwidth(dev, args.copy_bytes)
    report["h2d_gbps"], report["d2h_gbps"] = host_bandwidth(dev, args.host_bytes)
    report["correctness"] = asdict(correctness(dev, args.correctness_n))
    if args.sustain_s > 0:
        report["sustained"] = asdict(deep.sustained_gemm(dev, args.n, args.sustain_s))
    if args.memtest_fraction > 0:
        report["memtest"] = asdict(deep.memory_test(dev, args.memtest_fraction))
    return report


def run_host(args: argparse.Namespace) -> dict[str, Any]:
    """What torch sees; with no CUDA device, CPU GEMM throughput (the local cloud's figure)."""
    torch = load_torch()
    report: dict[str, Any] = {"info": device_info("cpu")}
    report["info"]["cuda_available"] = torch.cuda.is_available()
    report["info"]["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not report["info"]["cuda_available"]:
        report["name"] = "cpu"
        report["gemm"] = _cpu_dtypes_and_gemm(args.n)
        report["correctness"] = asdict(correctness("cpu", min(args.n, 512), repeats=4))
    return report


def run_allreduce(args: argparse.Namespace) -> dict[str, Any]:
    return allreduce(
        args.rank, args.world, args.init, args.sizes, warmup=args.warmup, repeats=args.repeats
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m optimizer.probes.active")
    sub = p.add_subparsers(dest="task", required=True)
    g = sub.add_parser("gpu")
    g.add_argument("--n", type=int, default=8192)
    g.add_argument("--dtypes", nargs="+", default=list(GEMM_DTYPES))
    g.add_argument("--fp64-n", type=int, default=0, help="fp64 size (0: half of --n)")
    g.add_argument("--warmup", type=int, default=5)
    g.add_argument("--repeats", type=int, default=20)
    g.add_argument("--copy-bytes", type=int, default=GIB)
    g.add_argument("--host-bytes", type=int, default=GIB)
    g.add_argument("--correctness-n", type=int, default=4096)
    g.add_argument("--sustain-s", type=float, default=0.0)
    g.add_argument("--memtest-fraction", type=float, default=0.0)
    h = sub.add_parser("host")
    h.add_argument("--n", type=int, default=1024)
    a = sub.add_parser("allreduce")
    a.add_argument("--rank", type=int, required=True)
    a.add_argument("--world", type=int, required=True)
    a.add_argument("--init", required=True)
    a.add_argument("--sizes", type=int, nargs="+", default=[GIB])
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--repeats", type=int, default=20)
    for sp in (g, h, a):
        sp.add_argument("--out", required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    task = {"gpu": run_gpu, "host": run_host, "allreduce": run_allreduce}[args.task]
    try:
        report = task(args)
    except ImportError as exc:
        report = {"error": f"torch is not usable: {exc}"}
    except Exception as exc:  # reported, judged as a failed probe by the parent
        report = {"error": f"{type(exc).__name__}: {exc}"}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
