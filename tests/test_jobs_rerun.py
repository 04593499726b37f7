"""Running a job again under its name: `gpuopt jobs submit --name` and `gpuopt jobs rm`,
as users run them (real processes: `gpuopt daemon` on loopback and each CLI command)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, policy_text, run_gpuopt, wait_until, write_policy

pytestmark = pytest.mark.usefixtures("daemon_env")

# A job no offer can take: it waits `pending` until it is cancelled, and never starts an
# instance, so the test needs no agent.
JOB = """\
name: train
policy: huge
run: python train.py
checkpoint_dir: /tmp/never-used
probes: none
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    data = tmp_path / "data"
    write_policy(data / "policies", "huge.yaml", policy_text("huge", memory=4096))
    process = DaemonProcess(data)
    try:
        wait_until(process.healthy, 60, "the daemon to serve")
        yield process
    finally:
        process.stop()


def gpuopt(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuopt <args>` against the daemon: its URL from GPUOPT_API_URL, its token from the
    file it wrote in the data directory, as for a user's second terminal."""
    return run_gpuopt(daemon.data_dir, *args, env={"GPUOPT_API_URL": daemon.url})


def state(daemon: DaemonProcess, name: str) -> str:
    shown = gpuopt(daemon, "jobs", "show", name, "--json")
    assert shown.returncode == 0, shown.stderr
    return str(json.loads(shown.stdout)["state"])


def test_a_job_runs_again_under_a_new_name_or_its_own_once_removed(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    spec = tmp_path / "train.yaml"
    spec.write_text(JOB)
    first = gpuopt(daemon, "jobs", "submit", str(spec))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("train: pending")

    # The same spec again: refused, saying how to get out.
    again = gpuopt(daemon, "jobs", "submit", str(spec))
    assert again.returncode == 2
    assert again.stderr.startswith(
        "gpuopt: error: 409: a job named 'train' already exists (pending): submit it under "
        "another name (`gpuopt jobs submit FILE --name NEW`), or cancel it"
    )
    # Way out 1: another name, from the same file.
    renamed = gpuopt(daemon, "jobs", "submit", str(spec), "--name", "train-2")
    assert renamed.returncode == 0, renamed.stderr
    assert renamed.stdout.startswith("train-2: pending")
    bad_name = gpuopt(daemon, "jobs", "submit", str(spec), "--name", "Train_2")
    assert bad_name.returncode == 2 and bad_name.stderr.startswith("gpuopt: error: --name")

    # Way out 2: remove the job once it has ended; not before.
    live = gpuopt(daemon, "jobs", "rm", "train")
    assert live.returncode == 2
    assert live.stderr == (
        "gpuopt: error: 409: job 'train' is pending: only an ended job can be removed; "
        "cancel it first (`gpuopt jobs cancel train`) and remove it once it has ended\n"
    )
    old_id = json.loads(gpuopt(daemon, "jobs", "show", "train", "--json").stdout)["id"]
    assert gpuopt(daemon, "jobs", "cancel", "train").returncode == 0
    wait_until(lambda: state(daemon, "train") == "cancelled", 30, "the cancel to be decided")
    removed = gpuopt(daemon, "jobs", "rm", "train")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout == f"removed train (cancelled; its events stay under job id {old_id})\n"

    listed = gpuopt(daemon, "jobs", "list", "--json")
    assert [j["name"] for j in json.loads(listed.stdout)] == ["train-2"]
    gone = gpuopt(daemon, "jobs", "show", "train")
    assert (gone.returncode, gone.stderr) == (2, "gpuopt: error: 404: no job named 'train'\n")

    rerun = gpuopt(daemon, "jobs", "submit", str(spec))
    assert rerun.returncode == 0, rerun.stderr
    shown = json.loads(gpuopt(daemon, "jobs", "show", "train", "--json").stdout)
    assert shown["state"] == "pending" and shown["id"] != old_id
    # The removed job's events stay in the store under its id.
    with daemon.client() as client:
        kept = client.get("/events", params={"kind": "job.removed"}).json()["events"]
    assert [(e["job_id"], e["data"]) for e in kept] == [
        (old_id, {"job": "train", "state": "cancelled"})
    ]
