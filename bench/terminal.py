"""Terminal transcripts: what `gpuopt jobs list`, `jobs show`, `offers --policy` and `costs`
print at 80 and 120 columns, on a real daemon with a real job.

Starts `gpuopt daemon` as the examples README does (a fresh data directory, the example
policy `examples/local-train-policy.yaml`, the embedded local cloud, an ephemeral port),
submits two jobs of `examples/train_with_checkpoints.py` (shipped as their code, checkpoints
in a local bucket): `train-example`, long, and `eval-short`, which finishes. Once
`train-example` has reported progress it interrupts its instance (`gpuopt local interrupt`),
waits for the job to run again on its second attempt, and captures each command with
`COLUMNS=80` and `COLUMNS=120` (piped output fits COLUMNS: optimizer/cli/render.py) into
bench/results/terminal/<command>-<width>.txt, each under the command line it ran (the
temporary data directory written as `$GPUOPT_DATA_DIR`). Then it cancels the job and stops
the daemon.

    python bench/terminal.py
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "terminal"
POLICY = ROOT / "examples" / "local-train-policy.yaml"
WIDTHS = (80, 120)
COMMANDS = {
    "jobs-list": ["jobs", "list"],
    "jobs-list-all": ["jobs", "list", "--all"],
    "jobs-show": ["jobs", "show", "train-example"],
    "offers-policy": ["offers", "--policy", "local-train", "--limit", "8"],
    "costs": ["costs"],
}


def wait(check: Callable[[], Any], what: str, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def job_spec(folder: Path, name: str, steps: int, sleep: float) -> Path:
    spec = {
        "apiVersion": "gpuopt/v1",
        "kind": "Job",
        "name": name,
        "policy": "local-train",
        "workdir": str(ROOT / "examples"),
        "run": (
            f"python train_with_checkpoints.py --engine numpy --steps {steps} "
            f"--checkpoint-every 20 --step-sleep {sleep} --log-every 100"
        ),
        "checkpoint": f"file://{folder / ('bucket-' + name)}",
        "probes": "none",
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def main() -> None:
    data = Path(tempfile.mkdtemp(prefix="gpuopt-bench-terminal-"))
    (data / "policies").mkdir()
    shutil.copy(POLICY, data / "policies")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    env.pop("COLUMNS", None)
    env["GPUOPT_DATA_DIR"] = str(data)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "optimizer.cli", "daemon", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=open(data / "daemon.log", "w"),  # noqa: SIM115 (closed with the process)
        text=True,
        env=env,
        cwd=ROOT,
    )

    def gpuopt(*args: str, columns: int | None = None) -> str:
        run_env = env if columns is None else {**env, "COLUMNS": str(columns)}
        done = subprocess.run(
            [sys.executable, "-m", "optimizer.cli", *args],
            capture_output=True,
            text=True,
            env=run_env,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"gpuopt {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    try:
        assert daemon.stdout is not None
        match = re.search(r"API at (http://\S+)", daemon.stdout.readline())
        if not match:
            raise RuntimeError("the daemon did not say where its API is")
        env["GPUOPT_API_URL"] = url = match.group(1)
        token = (data / "api-token").read_text().strip()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        wait(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200, "ready")
        print(f"daemon ready at {url}")
        gpuopt("jobs", "submit", str(job_spec(data, "eval-short", 60, 0.01)))
        gpuopt("jobs", "submit", str(job_spec(data, "train-example", 20_000, 0.05)))

        def job(name: str) -> dict[str, Any]:
            return dict(api.get(f"/jobs/{name}").json())

        wait(lambda: job("train-example")["progress"], "train-example's progress")
        first = job("train-example")["placement"]
        instance = wait(
            lambda: next(
                (a["instance_id"] for a in job("train-example")["attempts"] if a["instance_id"]),
                None,
            ),
            "train-example's instance",
        )
        gpuopt("local", "interrupt", instance, "--grace", "2")
        print(f"interrupted {instance} (attempt {first['attempt']})")
        wait(
            lambda: (
                (p := job("train-example")["placement"])
                and p["attempt"] > first["attempt"]
                and p["running"]
                and job("train-example")["state"] == "running"
            ),
            "train-example running again",
        )
        wait(lambda: job("eval-short")["state"] == "succeeded", "eval-short to finish")
        wait(lambda: job("train-example")["progress"]["step"] > 100, "more progress")
        RESULTS.mkdir(parents=True, exist_ok=True)
        for name, args in COMMANDS.items():
            for width in WIDTHS:
                # the data directory is a fresh temporary folder: named as its setting
                out = gpuopt(*args, columns=width).replace(str(data), "$GPUOPT_DATA_DIR")
                text = f"$ COLUMNS={width} gpuopt {' '.join(args)}\n{out}"
                (RESULTS / f"{name}-{width}.txt").write_text(text)
                widest = max(len(line) for line in out.splitlines())
                print(f"{name} at {width}: {len(out.splitlines())} lines, widest {widest}")
        gpuopt("jobs", "cancel", "train-example")
        wait(lambda: job("train-example")["state"] == "cancelled", "the cancel", 120)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(data, ignore_errors=True)
    print(f"wrote {RESULTS.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
