"""How long the demo daemon takes to stop: SIGTERM to "stopped" to the process's exit.

Each run starts a real `gpuopt daemon` as the examples README does (a fresh data directory,
the example policy `examples/local-train-policy.yaml`, the embedded local cloud, an
ephemeral port, JSON logs), waits until /readyz says the first polls are done, idles, sends
SIGTERM and times, from this process's monotonic clock:

- signal → "stopped": the loops finishing their iterations, the API and the providers
  closing (the daemon's last log line);
- "stopped" → exit: what the process does after its last line (the headline: a stopped
  daemon has nothing left to do);
- signal → exit: the whole clean stop (target: under 1 s).

Prints one line per run and the medians, and writes bench/results/stop.json.

    python bench/stop.py [--runs 5] [--idle-s 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "stop.json"
POLICY = ROOT / "examples" / "local-train-policy.yaml"
TARGET_S = 1.0


def one_stop(idle_s: float) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="gpuopt-bench-stop-"))
    (data / "policies").mkdir()
    shutil.copy(POLICY, data / "policies")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    env["GPUOPT_DATA_DIR"] = str(data)
    proc = subprocess.Popen(
        [sys.executable, "-m", "optimizer.cli", "daemon", "--port", "0", "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert proc.stdout is not None
        match = re.search(r"API at (http://\S+)", proc.stdout.readline())
        if not match:
            raise RuntimeError("the daemon did not say where its API is")
        url = match.group(1)
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/readyz", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon was not ready within 120 s")
            time.sleep(0.05)
        time.sleep(idle_s)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        exited = time.monotonic()
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)
    stopped = next(
        (at for at, line in lines if line.startswith("{") and json.loads(line)["msg"] == "stopped"),
        None,
    )
    if stopped is None:
        raise RuntimeError("the daemon never logged 'stopped'")
    return {
        "exit_code": code,
        "signal_to_stopped_s": round(stopped - signalled, 3),
        "stopped_to_exit_s": round(exited - stopped, 3),
        "signal_to_exit_s": round(exited - signalled, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=1.0)
    args = parser.parse_args()

    runs = []
    for n in range(1, args.runs + 1):
        runs.append({"run": n, **one_stop(args.idle_s)})
        print(json.dumps(runs[-1]))
    figures = {
        key: {
            "median": statistics.median(r[key] for r in runs),
            "max": max(r[key] for r in runs),
        }
        for key in ("signal_to_stopped_s", "stopped_to_exit_s", "signal_to_exit_s")
    }
    result = {
        "bench": "stop",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cores": len(os.sched_getaffinity(0)),
        "idle_s": args.idle_s,
        "runs": runs,
        **figures,
        "target_signal_to_exit_s": TARGET_S,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for key, figure in figures.items():
        print(f"{key}: median {figure['median']} s, max {figure['max']} s")
    print(f"(target: signal to exit under {TARGET_S:g} s)")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
