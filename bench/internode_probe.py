"""The inter-node probe run as N "nodes" on one host: one process per GPU (or per CPU node),
meeting over torch.distributed's TCP rendezvous on loopback, as the agents of a multi-node
attempt do. Prints each node's result and writes bench/results/<name>.json.

    python -m bench.internode_probe                      # one node per visible GPU (NCCL)
    python -m bench.internode_probe --nodes 2 --cpu      # gloo on CPU, two processes

Each node's process sees one GPU (`CUDA_VISIBLE_DEVICES`), so NCCL between them goes over
whatever links the GPUs share (NVLink on an H200 host). The verdict uses the fabric figure
given (`--expected-gbps`, Gbit/s per instance; default: p5e.48xlarge's 3,200 Gbit/s EFA, the
AWS H200 type, from optimizer/hardware.py) and the daemon's fraction (0.25).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from optimizer import hardware

RESULTS = Path(__file__).parent / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpu_count() -> int:
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def run(nodes: int, *, cpu: bool, expected: float | None, size_mib: int | None) -> dict[str, Any]:
    port = str(free_port())
    procs = []
    started = time.perf_counter()
    for rank in range(nodes):
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = "" if cpu else str(rank)
        argv = [sys.executable, "-m", "optimizer.probes.internode", "--rank", str(rank)]
        argv += ["--nodes", str(nodes), "--master-addr", "127.0.0.1", "--master-port", port]
        argv += ["--timeout-s", "120", "--min-fraction", "0.25"]
        if expected is not None:
            argv += ["--expected-gbps", str(expected)]
        if size_mib:
            argv += ["--size-mib", str(size_mib)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        results.append(json.loads(lines[-1]) if lines else {"status": "fail", "reason": out[-300:]})
    return {"wall_s": round(time.perf_counter() - started, 2), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=None, help="default: the GPUs visible")
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU instead of NCCL")
    parser.add_argument("--expected-gbps", type=float, default=None)
    parser.add_argument("--size-mib", type=int, default=None)
    parser.add_argument("--name", default=None, help="results file name (no .json)")
    args = parser.parse_args(argv)
    gpus = 0 if args.cpu else gpu_count()
    nodes = args.nodes or max(gpus, 2)
    if not args.cpu and gpus < nodes:
        print(f"{nodes} nodes need {nodes} GPUs; {gpus} visible (use --cpu)", file=sys.stderr)
        return 2
    expected = args.expected_gbps
    if expected is None:
        expected = hardware.instance_fabric("aws", "p5e.48xlarge").gbps
    found = run(nodes, cpu=args.cpu, expected=expected, size_mib=args.size_mib)
    report = {
        "bench": "internode_probe",
        "host": platform.node(),
        "backend": found["results"][0].get("backend"),
        "nodes": nodes,
        "expected_gbps": expected,
        "min_fraction": 0.25,
        **found,
    }
    for node in found["results"]:
        print(
            f"node {node.get('rank')}: {node.get('backend')} busbw {node.get('busbw_gbs', 0):.2f} "
            f"GB/s, links {[round(x['gbs'] or 0, 2) for x in node.get('links', [])]} GB/s: "
            f"{node.get('status')} ({node.get('reason')})"
        )
    name = args.name or ("internode_probe_cpu" if args.cpu else f"internode_probe_{nodes}gpu")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote bench/results/{name}.json")
    return 0 if all(n.get("status") != "fail" for n in found["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
