"""The inter-node probe: an all-reduce across the nodes of a multi-node attempt, and each
neighbouring pair's point-to-point bandwidth, judged against the fabric's line rate.

Every node runs `python -m optimizer.probes.internode --rank R --nodes N --master-addr A
--master-port P` at the same time (the agent does, when the daemon says so); they meet over
torch.distributed's TCP rendezvous at rank 0. NCCL where a CUDA device exists, gloo on CPU
(so the same code runs on the local cloud). It prints one JSON object:

    {"status": "pass|warn|fail", "reason": "...", "backend": "nccl", "busbw_gbs": 181.2,
     "algbw_gbs": 181.2, "bytes": 268435456, "pairs": [{"a": 0, "b": 1, "gbs": 45.1}], ...}

Bus bandwidth is nccl-tests' definition for all-reduce: algbw x 2(n-1)/n, with algbw the
buffer's bytes over the time of one all-reduce (github.com/NVIDIA/nccl-tests,
doc/PERFORMANCE.md). `judge` is pure: a link below `min_fraction` of the fabric's line rate
(Gbit/s per instance, optimizer/hardware.py) fails naming the slowest pair; a failed
collective fails naming the pair it could not complete.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True, slots=True)
class Link:
    """One pair's measured point-to-point bandwidth, GB/s (None: the transfer failed)."""

    a: int
    b: int
    gbs: float | None
    error: str = ""


def ring_pairs(nodes: int) -> list[tuple[int, int]]:
    """The neighbouring pairs of the ring (0,1), (1,2) … (n-1,0); one pair for two nodes."""
    if nodes < 2:
        return []
    if nodes == 2:
        return [(0, 1)]
    return [(i, (i + 1) % nodes) for i in range(nodes)]


def bus_bandwidth(nbytes: int, seconds: float, nodes: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of one all-reduce of `nbytes` taking `seconds` over `nodes`."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (nodes - 1) / nodes


def judge(
    busbw_gbs: float | None,
    links: Sequence[Link],
    *,
    expected_gbps: float | None,
    min_fraction: float,
    correct: bool = True,
) -> tuple[str, str]:
    """(status, reason): fail on a failed or wrong collective or a link below `min_fraction`
    of the fabric's line rate (`expected_gbps`, Gbit/s; None: no figure to judge speed by)."""
    broken = [link for link in links if link.gbs is None]
    if broken:
        link = broken[0]
        return (
            "fail",
            f"inter-node link between node {link.a} and node {link.b} failed: {link.error}",
        )
    if not correct:
        return "fail", "inter-node all-reduce returned wrong values"
    if busbw_gbs is None:
        return "fail", "inter-node all-reduce did not complete"
    if expected_gbps is None:
        return "pass", f"all-reduce bus bandwidth {busbw_gbs:.2f} GB/s (no fabric figure to judge)"
    floor = min_fraction * expected_gbps / 8  # Gbit/s -> GB/s
    slow = sorted(
        (link for link in links if link.gbs is not None and link.gbs < floor),
        key=lambda link: link.gbs or 0.0,
    )
    of = f"{min_fraction:.0%} of the fabric's {expected_gbps:g} Gbit/s"
    if slow:
        link = slow[0]
        return "fail", (
            f"slow inter-node link between node {link.a} and node {link.b}: "
            f"{link.gbs:.2f} GB/s < {floor:.2f} GB/s ({of})"
        )
    if busbw_gbs < floor:
        return (
            "fail",
            f"inter-node all-reduce bus bandwidth {busbw_gbs:.2f} GB/s < {floor:.2f} GB/s ({of})",
        )
    return "pass", f"all-reduce bus bandwidth {busbw_gbs:.2f} GB/s >= {floor:.2f} GB/s ({of})"


def measure(
    rank: int,
    nodes: int,
    master_addr: str,
    master_port: int,
    *,
    timeout_s: float = 120.0,
    size_bytes: int | None = None,
    iterations: int | None = None,
) -> dict[str, Any]:
    """Run the collective on this node; every node calls it at once. Never raises."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    size = size_bytes or (256 << 20 if cuda else 16 << 20)
    iters = iterations or (20 if cuda else 5)
    out: dict[str, Any] = {"rank": rank, "nodes": nodes, "backend": backend, "bytes": size}
    links: list[Link] = []
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=nodes,
            timeout=timedelta(seconds=timeout_s),
        )
    except Exception as exc:  # the rendezvous failed: this node could not reach rank 0
        peer = 0 if rank else 1
        out["links"] = [asdict(Link(min(rank, peer), max(rank, peer), None, _error(exc)))]
        return out
    try:
        buf = torch.full((size // 4,), float(rank + 1), dtype=torch.float32, device=device)

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()

        for _ in range(2):  # warm-up: connections and buffers
            dist.all_reduce(buf)
        buf.fill_(float(rank + 1))
        dist.all_reduce(buf)
        sync()
        want = nodes * (nodes + 1) / 2
        out["correct"] = bool(
            math.isclose(float(buf[0]), want) and math.isclose(float(buf[-1]), want)
        )
        dist.barrier()
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        sync()
        elapsed = (time.perf_counter() - start) / iters
        out["algbw_gbs"], out["busbw_gbs"] = bus_bandwidth(size, elapsed, nodes)
        out["allreduce_s"] = elapsed
        for a, b in ring_pairs(nodes):
            links.append(_pair(dist, buf, rank, a, b, iters, sync))
            dist.barrier()
    except Exception as exc:
        out.setdefault("error", _error(exc))
        peer = (rank + 1) % nodes
        links.append(Link(min(rank, peer), max(rank, peer), None, _error(exc)))
    finally:
        with contextlib.suppress(Exception):  # nothing left to report
            dist.destroy_process_group()
    out["links"] = [asdict(link) for link in links]
    return out


def _pair(dist: Any, buf: Any, rank: int, a: int, b: int, iters: int, sync: Any) -> Link:
    """Bytes from a to b and back, timed on `a`; the measured rate is shared through the
    all-reduce that follows, so every node reports every pair."""
    import torch

    gbs = 0.0
    if rank in (a, b):
        peer = b if rank == a else a
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            if rank == a:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
        sync()
        gbs = 2 * iters * buf.numel() * 4 / (time.perf_counter() - start) / 1e9
    shared = torch.tensor([gbs if rank == a else 0.0], dtype=torch.float64, device=buf.device)
    dist.all_reduce(shared)
    return Link(a, b, float(shared[0]))


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def verdict(
    measured: dict[str, Any], *, expected_gbps: float | None, min_fraction: float
) -> dict[str, Any]:
    """The measurement with its judged status and reason."""
    links = [Link(**link) for link in measured.get("links") or []]
    status, reason = judge(
        measured.get("busbw_gbs"),
        links,
        expected_gbps=expected_gbps,
        min_fraction=min_fraction,
        correct=bool(measured.get("correct", False)),
    )
    return {**measured, "status": status, "reason": reason, "expected_gbps": expected_gbps}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimizer.probes.internode")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--expected-gbps", type=float, default=None)
    parser.add_argument("--min-fraction", type=float, default=0.25)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--size-mib", type=int, default=None)
    args = parser.parse_args(argv)
    if args.master_addr.startswith("127."):  # nodes on one host: gloo over loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    measured = measure(
        args.rank,
        args.nodes,
        args.master_addr,
        args.master_port,
        timeout_s=args.timeout_s,
        size_bytes=args.size_mib << 20 if args.size_mib else None,
    )
    result = verdict(measured, expected_gbps=args.expected_gbps, min_fraction=args.min_fraction)
    print(json.dumps(result), flush=True)
    return 0 if result["status"] != "fail" else 1


if __name__ == "__main__":
    sys.exit(main())
