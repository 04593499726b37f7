"""A daemon killed with SIGKILL in the middle of a recovery resumes from the store: the job
is not lost and no instance is launched twice. Real processes throughout: `gpuopt daemon`,
the local cloud's instances and their agents."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.local import LocalCloud
from tests.helpers import DaemonProcess, wait_until, write_policy
from tests.helpers.code import ship
from tests.helpers.jobs import bucket, done_summary

pytestmark = pytest.mark.slow
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


def start_daemon(data: Path, port: int) -> DaemonProcess:
    """`gpuopt daemon` on `data`, on `port` (the same for the daemon after the kill, whose
    agents report to that address), serving once this returns."""
    daemon = DaemonProcess(data, "--port", str(port), env={"GPUOPT_API__TOKEN": TOKEN})
    wait_until(daemon.healthy, 60, "the daemon to serve")
    return daemon


def job_of(daemon: DaemonProcess, name: str) -> dict[str, Any]:
    with daemon.client() as client:
        return client.get(f"/jobs/{name}").json()


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    write_policy(tmp_path / "policies", "local-any.yaml", POLICY)
    yield tmp_path
    LocalCloud(tmp_path / "local-cloud").kill_all()


def test_sigkill_mid_recovery_resumes_without_duplicates(data: Path) -> None:
    port = free_port()
    first = start_daemon(data, port)
    ckpt = data / "ckpt"
    body = {
        "name": "survivor",
        "policy": "local-any",
        "code": ship(first, token=TOKEN),  # examples/, run from the archive as on a real cloud
        "run": "python train_with_checkpoints.py --engine numpy --steps 250 "
        "--checkpoint-every 5 --step-sleep 0.02 --log-every 100",
        "checkpoint": bucket(ckpt),
        "probes": "none",
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(f"{first.url}/jobs", json=body, headers=headers).status_code == 201
    wait_until(lambda: job_of(first, "survivor")["state"] == "running", 60, "the job to run")
    cloud = LocalCloud(data / "local-cloud")
    running = [r for r in cloud.instances() if r.state == "running"]
    assert len(running) == 1
    cloud.interrupt(running[0].id, grace_s=3)
    # mid-recovery: the daemon has seen the notice and launched (or is launching) a replacement
    wait_until(lambda: job_of(first, "survivor")["restarts"] == 1, 30, "the relaunch decision")
    first.kill(signal.SIGKILL)

    second = start_daemon(data, port)
    try:
        job = wait_until(
            lambda: (j := job_of(second, "survivor"))["state"] in ("succeeded", "failed") and j,
            120,
            "the job to finish",
        )
        assert job["state"] == "succeeded", job
        records = [r for r in cloud.instances() if r.job == "survivor" or r.key.startswith("1-")]
        keys = [r.key for r in records]
        assert len(keys) == len(set(keys)), f"an attempt was launched twice: {keys}"
        done = done_summary(ckpt)
        assert done["steps"] == 250
    finally:
        second.kill(signal.SIGTERM)
