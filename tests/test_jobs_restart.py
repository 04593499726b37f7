"""A daemon killed with SIGKILL in the middle of a recovery resumes from the store: the job
is not lost and no instance is launched twice. Real processes throughout: `gpuopt daemon`,
the local cloud's instances and their agents."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_daemon_harness import wait_until, write_policy

from providers.local import LocalCloud

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TOKEN = "restart-test-token-42"
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: local-any
workload: {gpus: 1, gpu_memory_gib: 12}
markets: [spot, on_demand]
placement: {providers: [local]}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DaemonProcess:
    def __init__(self, data: Path, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
        env.update(GPUOPT_DATA_DIR=str(data), GPUOPT_API__TOKEN=TOKEN)
        self.url = f"http://127.0.0.1:{port}"
        self.log = (data / f"daemon-{port}-{os.getpid()}.log").open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "optimizer.cli", "daemon", "--port", str(port)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        wait_until(self.healthy, 60, "the daemon to serve")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def job(self, name: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return httpx.get(f"{self.url}/jobs/{name}", headers=headers, timeout=5).json()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    write_policy(tmp_path / "policies", "local-any.yaml", POLICY)
    yield tmp_path
    LocalCloud(tmp_path / "local-cloud").kill_all()


def test_sigkill_mid_recovery_resumes_without_duplicates(data: Path) -> None:
    port = free_port()
    first = DaemonProcess(data, port)
    ckpt = data / "ckpt"
    body = {
        "name": "survivor",
        "policy": "local-any",
        "workdir": str(ROOT),
        "run": f"{sys.executable} examples/train_with_checkpoints.py --steps 250 "
        "--checkpoint-every 5 --step-sleep 0.02 --log-every 100",
        "checkpoint_dir": str(ckpt),
        "probes": "none",
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(f"{first.url}/jobs", json=body, headers=headers).status_code == 201
    wait_until(lambda: first.job("survivor")["state"] == "running", 60, "the job to run")
    cloud = LocalCloud(data / "local-cloud")
    running = [r for r in cloud.instances() if r.state == "running"]
    assert len(running) == 1
    cloud.interrupt(running[0].id, grace_s=3)
    # mid-recovery: the daemon has seen the notice and launched (or is launching) a replacement
    wait_until(lambda: first.job("survivor")["restarts"] == 1, 30, "the relaunch decision")
    first.kill(signal.SIGKILL)

    second = DaemonProcess(data, port)
    try:
        job = wait_until(
            lambda: (j := second.job("survivor"))["state"] in ("succeeded", "failed") and j,
            120,
            "the job to finish",
        )
        assert job["state"] == "succeeded", job
        records = [r for r in cloud.instances() if r.job == "survivor" or r.key.startswith("1-")]
        keys = [r.key for r in records]
        assert len(keys) == len(set(keys)), f"an attempt was launched twice: {keys}"
        done = json.loads((ckpt / "done.json").read_text())
        assert done["steps"] == 250
    finally:
        second.kill(signal.SIGTERM)
