"""Job logs through a real daemon (in-process, SQLite, real HTTP on loopback): how fast agents'
chunks are taken (POST /agent/v1/logs, batches shaped like the agent's: 16 chunks of about
16 KiB of lines), with the per-job cap trimming once the job is past it; how long reading the
whole log and a 100-line tail takes (GET /jobs/{name}/logs); and how soon a follower sees a
chunk after it was posted. Prints figures and writes them to bench/results/job_logs.json.

    python bench/job_logs.py [--mib 32] [--cap-mib 16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    # Run as a file (`python bench/job_logs.py`): the tests' helpers it uses are the package
    # `tests.helpers` of the repository root, so run this file as the module bench.job_logs
    # from there, where `python -m` finds both packages.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.job_logs", *sys.argv[1:]])

from optimizer.clock import utc_now  # noqa: E402
from optimizer.store import token_sha256  # noqa: E402
from tests.helpers import TOKEN, make_config, make_offer, running, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "job_logs.json"
CHUNK_LINES = 200  # lines of about 80 bytes: a chunk of about 16 KiB
BATCH = 16


def chunk_text(seq: int) -> str:
    return "".join(
        f"step {seq * CHUNK_LINES + i:09d} loss 0.{seq % 97:05d} lr 3e-4 throughput 1234.5/s\n"
        for i in range(CHUNK_LINES)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=32, help="output shipped in all")
    parser.add_argument("--cap-mib", type=float, default=16, help="logs.max_bytes_per_job")
    args = parser.parse_args()
    figures: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-logs-") as tmp:
        cap = int(args.cap_mib * (1 << 20))
        config = make_config(Path(tmp), logs={"max_bytes_per_job": cap})
        with running(config) as daemon:
            store = daemon.store
            job_id = store.jobs.add_job("bench", "small", {"run": "x"})
            store.jobs.create_attempt(
                job_id, 1, "bench-1", make_offer(), token_sha256("agent-token"), utc_now()
            )
            agent = httpx.Client(
                base_url=daemon.url, headers={"Authorization": "Bearer agent-token"}, timeout=30
            )
            user = httpx.Client(
                base_url=daemon.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
            )
            size = len(chunk_text(0).encode())
            chunks = int(args.mib * (1 << 20) / size)
            started = time.perf_counter()
            for first in range(0, chunks, BATCH):
                body = {
                    "attempt_key": "bench-1",
                    "chunks": [
                        {"seq": s, "stream": "stdout", "text": chunk_text(s)}
                        for s in range(first, min(first + BATCH, chunks))
                    ],
                }
                assert agent.post("/agent/v1/logs", json=body).status_code == 200
            took = time.perf_counter() - started
            shipped = chunks * size
            attempt = store.jobs.attempt("bench-1")
            assert attempt is not None
            figures["ingest"] = {
                "shipped_mib": round(shipped / (1 << 20), 1),
                "cap_mib": args.cap_mib,
                "held_mib": round(attempt.log_bytes / (1 << 20), 2),
                "dropped_mib": round(attempt.log_dropped_bytes / (1 << 20), 2),
                "seconds": round(took, 2),
                "mib_per_s": round(shipped / (1 << 20) / took, 1),
                "posts_per_s": round(chunks / BATCH / took, 1),
            }
            started = time.perf_counter()
            whole = user.get("/jobs/bench/logs")
            figures["read_all"] = {
                "mib": round(len(whole.content) / (1 << 20), 2),
                "seconds": round(time.perf_counter() - started, 3),
            }
            times = []
            for _ in range(5):
                started = time.perf_counter()
                tail = user.get("/jobs/bench/logs", params={"tail": 100})
                times.append(time.perf_counter() - started)
            lines = tail.text.splitlines()  # the header, the note on dropped output, 100 lines
            assert len(lines) == 102 and all(x.startswith("step ") for x in lines[2:])
            figures["tail_100_ms_median"] = round(statistics.median(times) * 1000, 1)
            figures["follow_latency_ms"] = follow_latency(daemon.url, agent, chunks)
    print(json.dumps(figures, indent=2))
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")


def follow_latency(url: str, agent: httpx.Client, seq: int, rounds: int = 10) -> dict[str, float]:
    """Milliseconds from a chunk's POST answered to its text read by a follower."""
    seen: list[tuple[float, str]] = []

    def read() -> None:
        with (
            httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=None) as client,
            client.stream(
                "GET", f"{url}/jobs/bench/logs", params={"follow": "true", "tail": 0, "attempt": 1}
            ) as r,
        ):
            for piece in r.iter_text():
                seen.append((time.perf_counter(), piece))

    threading.Thread(target=read, daemon=True).start()
    wait_until(lambda: seen, what="the follower's header")
    delays = []
    for n in range(rounds):
        mark = f"marker {n}\n"
        body = {
            "attempt_key": "bench-1",
            "chunks": [{"seq": seq + n, "stream": "stdout", "text": mark}],
        }
        agent.post("/agent/v1/logs", json=body)
        posted = time.perf_counter()
        at = wait_until(lambda m=mark: next((t for t, p in seen if m in p), None), 10, mark)
        delays.append((at - posted) * 1000)
    return {"median": round(statistics.median(delays), 1), "max": round(max(delays), 1)}


if __name__ == "__main__":
    main()
