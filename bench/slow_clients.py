"""Slow clients against `gpuopt daemon` run as a process under a 256-descriptor limit: N
connections that send part of a request's headers and never the rest, held for `--seconds`,
while a request to /healthz and one to /jobs (with the token) go every half second. Prints
how many of those were answered, when the server closed the slow connections, and how many
lines the daemon logged meanwhile; merges the figures, under `--label`, into
bench/results/slow_clients.json.

    python bench/slow_clients.py [--connections 300] [--seconds 20] [--label after]
    python bench/slow_clients.py --source DIR --label before   # another checkout's code
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "slow_clients.json"
TOKEN = "bench-token-" + "x" * 40
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: gpuopt\r\nX-Slow: "


def limit_descriptors(n: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--nofile", type=int, default=256, help="the daemon's descriptor limit")
    parser.add_argument("--label", default="after")
    parser.add_argument("--source", type=Path, default=None, help="run another checkout's code")
    args = parser.parse_args()
    source = (args.source or ROOT).resolve()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds the clients
    figures: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "connections": args.connections,
        "seconds": args.seconds,
        "daemon_nofile": args.nofile,
    }
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-slow-") as tmp:
        data = Path(tmp) / "data"
        log = Path(tmp) / "daemon.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
        env.update(PYTHONPATH=str(source), GPUOPT_DATA_DIR=str(data), GPUOPT_API__TOKEN=TOKEN)
        with log.open("w") as stderr:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "optimizer.cli", "daemon", "--port", "0"],
                env=env,
                cwd=source,  # `-m` puts the working directory first on the path
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                preexec_fn=lambda: limit_descriptors(args.nofile),
            )
        try:
            assert daemon.stdout is not None
            url = daemon.stdout.readline().split()[3]
            host, port = url.removeprefix("http://").rsplit(":", 1)
            lines_at_start = len(log.read_text().splitlines())
            figures.update(run(host, int(port), url, args))
            figures["daemon_log_lines"] = len(log.read_text().splitlines()) - lines_at_start
            figures["daemon_log_bytes"] = log.stat().st_size
            figures["daemon_exit_code_during_run"] = daemon.poll()
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(json.dumps(figures, indent=2))
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.label] = figures
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def run(host: str, port: int, url: str, args: argparse.Namespace) -> dict[str, Any]:
    sel = selectors.DefaultSelector()
    opened = time.monotonic()
    refused = 0
    for _ in range(args.connections):
        try:
            conn = socket.create_connection((host, port), timeout=5)
            conn.sendall(PARTIAL)
        except OSError:
            refused += 1
            continue
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ)
    held = len(sel.get_map())
    closed_after: list[float] = []
    answered = {"healthz": 0, "jobs": 0}
    asked = 0
    next_ask = time.monotonic()
    end = opened + args.seconds
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2) as client:
        while time.monotonic() < end:
            for key, _ in sel.select(timeout=0.05):
                try:
                    data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
                    closed_after.append(time.monotonic() - opened)
            if time.monotonic() >= next_ask:
                next_ask += 0.5
                asked += 1
                for name, path in (("healthz", "/healthz"), ("jobs", "/jobs")):
                    try:
                        if client.get(url + path).status_code == 200:
                            answered[name] += 1
                    except httpx.HTTPError:
                        pass
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    closed_after.sort()
    return {
        "connections_held_open_by_client": held,
        "connections_refused_at_connect": refused,
        "closed_by_server": len(closed_after),
        "closed_by_server_s_median": round(closed_after[len(closed_after) // 2], 2)
        if closed_after
        else None,
        "closed_by_server_s_max": round(closed_after[-1], 2) if closed_after else None,
        "requests_each": asked,
        "healthz_answered": answered["healthz"],
        "jobs_answered": answered["jobs"],
    }


if __name__ == "__main__":
    main()
