"""Memory of a daemon serving many followers of one large job log: a real daemon in this
process (SQLite, loopback HTTP), a job whose log is at the 16 MiB cap, and N clients in a
separate process that each follow it (`GET /jobs/bench/logs?follow=true`), read it all, stay
open, then go away. Prints this process's RSS (the daemon's, the clients live elsewhere)
before, at its highest while they read (sampled every 20 ms), once all have caught up, and
after they closed; merges them, under `--label`, into bench/results/log_followers.json.

    python bench/log_followers.py [--followers 100] [--mib 16] [--label after]
    python bench/log_followers.py --source DIR --label before   # another checkout's code

`--source` runs the daemon from another checkout (e.g. `git archive` of an older commit),
to compare: its `optimizer` and `tests.helpers` are imported instead of this one's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "log_followers.json"
LINE = 80  # bytes a line, newline included
CHUNK_LINES = 800  # a chunk of 64,000 bytes: about what the agent cuts (64 KiB at most)

# The clients, run by a second interpreter: follow, read everything, say when each has read
# `want` bytes, hold on until told (a line on stdin), then close every connection.
CLIENTS = r"""
import selectors, socket, sys
host, token = sys.argv[1], sys.argv[3]
port, n, want = int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5])
sel = selectors.DefaultSelector()
got = {}
request = (f"GET /jobs/bench/logs?follow=true HTTP/1.1\r\nHost: gpuopt\r\n"
           f"Authorization: Bearer {token}\r\n\r\n").encode()
for i in range(n):
    s = socket.create_connection((host, port))
    s.sendall(request)
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, i)
    got[i] = 0
sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
status = {}
done = set()
while True:
    for key, _ in sel.select():
        if key.data == "stdin":
            for k in list(sel.get_map().values()):
                if k.data != "stdin":
                    k.fileobj.close()
            print("closed", flush=True)
            sys.exit(0)
        data = key.fileobj.recv(1 << 20)
        if not data:
            sel.unregister(key.fileobj)
            key.fileobj.close()
            done.add(key.data)
            status.setdefault(key.data, "closed early")
        if key.data not in status:
            status[key.data] = data[:12].decode(errors="replace")
        got[key.data] += len(data)
        if got[key.data] >= want and key.data not in done:
            done.add(key.data)
        if len(done) == n and "reported" not in status:
            status["reported"] = True
            codes = sorted({v for k, v in status.items() if k != "reported"})
            print("caught up", sum(got.values()), ",".join(codes), flush=True)
"""


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class Sampler:
    """This process's RSS every `every` seconds on a thread: the highest seen."""

    def __init__(self, every: float = 0.02) -> None:
        self.peak = rss_mib()
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.peak = max(self.peak, rss_mib())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--followers", type=int, default=100)
    parser.add_argument("--mib", type=float, default=16, help="the job's log (at its cap)")
    parser.add_argument("--label", default="after")
    parser.add_argument("--source", type=Path, default=None, help="run another checkout's code")
    args = parser.parse_args()
    source = (args.source or ROOT).resolve()
    if os.environ.get("PYTHONPATH") != str(source):
        # Import `optimizer` and `tests.helpers` from `source`, ahead of anything installed.
        env = {**os.environ, "PYTHONPATH": str(source)}
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], env)

    from optimizer.clock import utc_now
    from optimizer.daemon.config import LogsConfig
    from optimizer.store import NewChunk, token_sha256
    from tests.helpers import TOKEN, make_config, make_offer, running, steady_clock

    cap = int(args.mib * (1 << 20))
    logs: dict[str, Any] = {"max_bytes_per_job": cap}
    capped = "max_followers_per_job" in LogsConfig.model_fields
    if capped:  # room for every follower of this one job
        logs.update(max_followers_per_job=args.followers, max_followers=args.followers)
    figures: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "followers": args.followers,
        "log_mib": args.mib,
        "follower_caps": capped,
    }
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-followers-") as tmp:
        config = make_config(Path(tmp), logs=logs)
        with running(config, clock=steady_clock()) as daemon:
            store = daemon.store
            job_id = store.jobs.add_job("bench", "small", {"run": "x"})
            attempt = store.jobs.create_attempt(
                job_id, 1, "bench-1", make_offer(), token_sha256("agent-token"), utc_now()
            )
            text = "".join(f"step {i:08d} ".ljust(LINE - 1, ".") + "\n" for i in range(CHUNK_LINES))
            chunks = cap // len(text)
            for first in range(0, chunks, 16):
                store.logs.append(
                    job_id=job_id,
                    attempt_id=attempt.id,
                    chunks=[
                        NewChunk(s, "stdout", text) for s in range(first, min(first + 16, chunks))
                    ],
                    max_bytes_per_job=cap,
                )
            held = chunks * len(text)
            gc.collect()
            figures["rss_mib_before"] = round(rss_mib(), 1)
            host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
            sampler = Sampler()
            started = time.perf_counter()
            clients = subprocess.Popen(
                [sys.executable, "-c", CLIENTS, host, port, TOKEN, str(args.followers), str(held)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert clients.stdout is not None and clients.stdin is not None
            said = clients.stdout.readline().split()
            figures["seconds_to_catch_up"] = round(time.perf_counter() - started, 1)
            figures["clients_said"] = " ".join(said)
            figures["rss_mib_peak_while_reading"] = sampler.stop()
            figures["rss_mib_all_caught_up"] = round(rss_mib(), 1)
            clients.stdin.write("close\n")
            clients.stdin.flush()
            clients.stdout.readline()
            clients.wait(30)
            deadline = time.monotonic() + 30
            while daemon.metrics.sample("gpuopt_log_followers") and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(2)
            gc.collect()
            figures["rss_mib_after_close"] = round(rss_mib(), 1)
    print(json.dumps(figures, indent=2))
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.label] = figures
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
