"""What reading the daemon's answers through their models (optimizer/answers.py) costs the
CLI: the import time of `gpuopt --help` (the sum of `python -X importtime`'s self times),
and the wall and CPU time of whole commands against a loopback HTTP server that answers as the
daemon does (`jobs list` of 50 jobs, `jobs show` of a job with 3 attempts, `costs --by
month` of 12 months), with which of them load pydantic. Each figure is the median of
--runs runs; the trees given with --tree are measured in turns, so that the machine's load
falls on each alike (the load average is recorded before and after). Prints the figures and
writes them to bench/results/cli_answers.json.

    python bench/cli_answers.py [--runs 9] [--tree before=/path/to/an/older/tree ...]

Without --tree, only this repository's tree is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "cli_answers.json"
TOKEN = "bench-token-0123456789"


def _job(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"job-{i}",
        "policy": "train",
        "state": "running" if i % 3 else "succeeded",
        "reason": None if i % 3 else "the command exited 0",
        "restarts": i % 4,
        "created_at": "2026-03-01T10:00:00Z",
        "updated_at": "2026-03-01T10:05:00Z",
        "cancel_requested_at": None,
        "removed_at": None,
        "spec": {"name": f"job-{i}", "policy": "train", "command": ["python", "train.py"]},
    }


FIGURES = {
    "spend_usd": 12.5,
    "storage_usd": 0.25,
    "total_usd": 12.75,
    "on_demand_usd": 40.0,
    "savings_usd": 27.5,
    "savings_fraction": 0.6875,
    "net_savings_fraction": 0.65,
    "billed_seconds": 36000,
    "overhead_seconds": 900,
    "overhead_usd": 0.31,
    "baseline_known": True,
}


def _attempt(n: int) -> dict[str, Any]:
    return {
        "number": n,
        "gang": None,
        "node_rank": 0,
        "nodes": 1,
        "provider": "aws",
        "region": "eu-west-1",
        "zone": "eu-west-1a",
        "instance_type": "p4d.24xlarge",
        "market": "spot",
        "usd_per_hour": 9.83,
        "instance_id": f"i-{n:017x}",
        "state": "ended",
        "end_reason": "interrupted",
        "started_at": "2026-03-01T10:00:00Z",
        "ended_at": "2026-03-01T11:00:00Z",
        "launched_at": "2026-03-01T09:58:00Z",
        "terminated_at": "2026-03-01T11:00:30Z",
        "terminated_by": "provider",
        "cost_lines": [
            {
                "month": "2026-03",
                "period_start": "2026-03-01T09:58:00Z",
                "period_end": "2026-03-01T11:00:30Z",
                "frozen": True,
                "refunded": False,
                **FIGURES,
            }
        ],
    }


ANSWERS: dict[str, Any] = {
    "/jobs": {"jobs": [_job(i) for i in range(50)]},
    "/jobs/job-1": {
        **_job(1),
        "attempts": [_attempt(n) for n in (1, 2, 3)],
        "gpu": {
            "current_utilization": 0.93,
            "current_at": "2026-03-01T12:04:00Z",
            "average_utilization": 0.88,
            "current_memory_used_gib": 61.0,
            "peak_memory_used_gib": 70.5,
            "memory_total_gib": 80.0,
            "peak_memory_used_ratio": 0.88,
            "since": "2026-03-01T11:58:00Z",
            "samples": 40,
            "attempt_id": 3,
            "throttle_reasons": 0,
            "xids": [],
            "simulated": False,
        },
    },
    "/costs": [{"group": f"2025-{m:02d}", **FIGURES, "attempt_count": 40} for m in range(1, 13)],
}

COMMANDS: dict[str, list[str]] = {
    "jobs list": ["jobs", "list"],
    "jobs show": ["jobs", "show", "job-1"],
    "costs --by month": ["costs", "--by", "month"],
}


class _Daemon(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        body = json.dumps(ANSWERS.get(path, {"detail": "not found"})).encode()
        self.send_response(200 if path in ANSWERS else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _run(tree: Path, args: list[str], *, importtime: bool = False) -> tuple[float, float, str]:
    """One `gpuopt ARGS` in `tree`: its wall time, its CPU time (user + system, which the
    machine's load disturbs less) and its stderr."""
    env = dict(os.environ, PYTHONPATH=str(tree), GPUOPT_API_TOKEN=TOKEN)
    flags = ["-X", "importtime"] if importtime else []
    cpu = _cpu()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *flags, "-m", "optimizer.cli", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    took, cpu = time.perf_counter() - started, _cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(
            f"{tree}: gpuopt {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
        )
    return took, cpu, done.stderr


def _imports(stderr: str) -> dict[str, int]:
    """`-X importtime`'s lines as module -> self time (microseconds)."""
    found: dict[str, int] = {}
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, _, name = line[len("import time:") :].split("|")
            found[name.strip()] = int(own)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    options = parser.parse_args()
    trees = {"this": ROOT}
    for given in options.tree:
        name, _, path = given.partition("=")
        trees[name] = Path(path).resolve()

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Daemon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_address[1]}"

    load_before = os.getloadavg()
    import_us: dict[str, list[int]] = {name: [] for name in trees}
    help_s: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    command_s: dict[str, dict[str, list[tuple[float, float]]]] = {
        name: {c: [] for c in COMMANDS} for name in trees
    }
    for _ in range(options.runs):
        for name, tree in trees.items():  # in turns: the load falls on each tree alike
            _, _, stderr = _run(tree, ["--help"], importtime=True)
            import_us[name].append(sum(_imports(stderr).values()))
            help_s[name].append(_run(tree, ["--help"])[:2])
            for command, args in COMMANDS.items():
                command_s[name][command].append(_run(tree, [*args, "--api", api])[:2])
    loaded: dict[str, dict[str, list[str]]] = {}
    for name, tree in trees.items():
        loaded[name] = {}
        for command, args in {"--help": ["--help"], **COMMANDS}.items():
            extra = [] if command == "--help" else ["--api", api]
            found = _imports(_run(tree, [*args, *extra], importtime=True)[2])
            loaded[name][command] = sorted(
                m for m in ("pydantic", "optimizer.answers", "providers.registry") if m in found
            )
    load_after = os.getloadavg()
    server.shutdown()

    result: dict[str, Any] = {
        "runs": options.runs,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_1_5_15": {"before": load_before, "after": load_after},
        "trees": {},
    }

    def medians(runs: list[tuple[float, float]]) -> dict[str, float]:
        return {
            "wall_s": statistics.median(r[0] for r in runs),
            "cpu_s": statistics.median(r[1] for r in runs),
        }

    for name in trees:
        figures: dict[str, Any] = {
            "help_import_total_s": statistics.median(import_us[name]) / 1e6,
            "help": medians(help_s[name]),
            "commands": {c: medians(v) for c, v in command_s[name].items()},
            "loads": loaded[name],
        }
        result["trees"][name] = figures
        print(
            f"{name}: gpuopt --help imports {figures['help_import_total_s']:.3f} s, runs "
            f"{figures['help']['wall_s']:.3f} s wall, {figures['help']['cpu_s']:.3f} s CPU "
            f"(loads {loaded[name]['--help'] or 'none'})"
        )
        for command, took in figures["commands"].items():
            print(
                f"  gpuopt {command}: {took['wall_s']:.3f} s wall, {took['cpu_s']:.3f} s CPU "
                f"(loads {loaded[name][command] or 'none'})"
            )
    print(f"load average before {load_before}, after {load_after} ({os.cpu_count()} CPUs)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
