"""Deep-probe pieces: a sustained GEMM load and a memory pattern test (torch, in the subprocess).

The runner samples clocks, power and temperature through NVML while these run; the all-reduce
size sweep reuses `active.allreduce` with `SWEEP_SIZES`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from optimizer.probes.schema import MemTest, Sustained
from optimizer.probes.tensors import GIB, load_torch, random_matrix, sync, torch_dtype

# nccl-tests sweeps -b 8 -e 8G -f 2 (REFERENCE 5.1); below 1 MiB an all-reduce measures
# latency, not links, so the sweep starts there and steps by 4 to stay within minutes.
SWEEP_SIZES = tuple(1 << s for s in range(20, 33, 2))  # 1 MiB .. 4 GiB
WINDOW_S = 1.0  # one throughput figure per second of sustained load
# Five patterns: all zeros, all ones, two alternating-bit words, and each word's own index
# (catches address-line faults that constant patterns cannot see).
PATTERNS: tuple[int | None, ...] = (0, -1, 0x5555555555555555, -0x5555555555555556, None)
_VERIFY_BLOCK = 1 << 24  # int64 words per index-pattern comparison (128 MiB)


def sustained_gemm(device: str, n: int, seconds: float, dtype: str = "bf16") -> Sustained:
    """Back-to-back n^3 GEMMs for `seconds`, timed in ~1 s windows with CUDA events."""
    torch = load_torch()
    dt = torch_dtype(dtype)
    a, b = random_matrix(device, n, dt, 11), random_matrix(device, n, dt, 12)
    c = torch.empty(n, n, device=device, dtype=dt)
    torch.mm(a, b, out=c)
    sync(device)
    t0 = time.perf_counter()
    torch.mm(a, b, out=c)
    sync(device)
    per_call = max(time.perf_counter() - t0, 1e-6)
    batch = max(1, int(min(WINDOW_S, seconds) / per_call))
    flop = 2.0 * n**3 * batch
    rates: list[float] = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds or not rates:
        if device.startswith("cuda"):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                torch.mm(a, b, out=c)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter()
            for _ in range(batch):
                torch.mm(a, b, out=c)
            elapsed = time.perf_counter() - t
        rates.append(flop / elapsed / 1e12)
    return Sustained(
        seconds=time.perf_counter() - began,
        tflops_median=statistics.median(rates),
        tflops_min=min(rates),
        windows=len(rates),
    )


def memory_test(
    device: str, fraction: float = 0.9, *, chunk_bytes: int = GIB, max_bytes: int | None = None
) -> MemTest:
    """Write each pattern over `fraction` of free memory, then read it all back and compare.

    Every chunk is written before any is verified, so a cell that loses its value while the
    rest of memory is written is caught, not just a cell that cannot store one.
    """
    torch = load_torch()
    began = time.perf_counter()
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(device)
        target = int(free * fraction)
    else:
        target = max_bytes or 64 << 20
    if max_bytes is not None:
        target = min(target, max_bytes)
    words = max(1, chunk_bytes // 8)
    chunks: list[Any] = []
    while (len(chunks) + 1) * chunk_bytes <= target:
        try:
            chunks.append(torch.empty(words, dtype=torch.int64, device=device))
        except torch.OutOfMemoryError:
            break
    if not chunks:  # less free memory than one chunk: test what there is
        chunks.append(torch.empty(max(1, target // 8), dtype=torch.int64, device=device))
    mismatches = 0
    for pattern in PATTERNS:
        base = 0
        for chunk in chunks:
            if pattern is None:
                torch.arange(base, base + chunk.numel(), out=chunk)
            else:
                chunk.fill_(pattern)
            base += chunk.numel()
        base = 0
        for chunk in chunks:
            if pattern is None:
                for s in range(0, chunk.numel(), _VERIFY_BLOCK):
                    e = min(s + _VERIFY_BLOCK, chunk.numel())
                    want = torch.arange(base + s, base + e, device=device, dtype=torch.int64)
                    mismatches += int((chunk[s:e] != want).sum())
            else:
                mismatches += int((chunk != pattern).sum())
            base += chunk.numel()
    tested = sum(c.numel() * 8 for c in chunks)
    del chunks
    return MemTest(
        bytes_tested=tested,
        patterns=len(PATTERNS),
        mismatches=mismatches,
        seconds=time.perf_counter() - began,
    )
