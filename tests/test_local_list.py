"""`gpuopt local list` as a person reads it: where it looked when there is nothing there, and
an aligned table that says who ended each instance (the cloud, or gpuopt)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer.daemon.service import Daemon
from providers.local import LocalCloud
from tests.helpers import api, wait_until
from tests.helpers.jobs import E2E_FIXTURES, job_body, running_instance, state_of

pytestmark = pytest.mark.usefixtures("daemon_env")


def gpuopt(
    *args: str, data_dir: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")} | (env or {})
    env["GPUOPT_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "args", [["list"], ["list", "--all", "--json"], ["interrupt", "i-local-0001"]]
)
def test_a_wrong_data_dir_is_named_and_nothing_is_created(tmp_path: Path, args: list[str]) -> None:
    wrong = tmp_path / "typo"
    done = gpuopt("local", *args, data_dir=wrong)
    assert done.returncode == 2, done.stdout
    assert done.stderr.splitlines() == [
        f"gpuopt: error: no local cloud at {wrong / 'local-cloud'} (from GPUOPT_DATA_DIR="
        f"{wrong}); a daemon creates it when it first launches an instance there"
    ]
    assert done.stdout == ""
    assert not wrong.exists()


def test_an_existing_cloud_without_instances_says_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "local-cloud").mkdir()
    done = gpuopt("local", "list", data_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"no running instances in {tmp_path / 'local-cloud'} (--all shows ended ones)\n"
    )
    everything = gpuopt("local", "list", "--all", data_dir=tmp_path)
    assert everything.stdout == f"no instances in {tmp_path / 'local-cloud'}\n"


def cells(line: str, starts: list[int]) -> list[str]:
    """A table line cut at the header's column starts."""
    ends = [*starts[1:], len(line)]
    return [line[a:b].strip() for a, b in zip(starts, ends, strict=True)]


clock, cloud, daemon = E2E_FIXTURES


@pytest.mark.slow
def test_local_list_is_aligned_and_says_gpuopt_ended_what_the_daemon_terminated(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    # One instance the daemon terminates (its job is cancelled), one a person interrupts.
    with api(daemon) as client:
        body = job_body("stopped", tmp_path / "ckpt", steps=1, run="sleep 60")
        assert client.post("/jobs", json=body).status_code == 201
        stopped = wait_until(lambda: running_instance(cloud, "stopped", 1), 30, "the instance")
        assert client.post("/jobs/stopped/cancel").status_code == 200
    wait_until(lambda: state_of(daemon, "stopped")["state"] == "cancelled", 30, "the cancel")
    wait_until(
        lambda: next(r for r in cloud.instances() if r.id == stopped).ended, 30, "the power-off"
    )
    with api(daemon) as client:
        body = job_body("preempted", tmp_path / "ckpt2", steps=1, run="sleep 60")
        assert client.post("/jobs", json=body).status_code == 201
        preempted = wait_until(lambda: running_instance(cloud, "preempted", 1), 30, "instance 2")
        interrupted = gpuopt(
            "local", "interrupt", preempted, "--grace", "0", data_dir=tmp_path,
            env=cloud.clock_env(),  # on the cloud's clock, as the instance's machine is
        )  # fmt: skip
        assert interrupted.returncode == 0, interrupted.stderr
        wait_until(
            lambda: next(r for r in cloud.instances() if r.id == preempted).ended,
            30,
            "the interruption's power-off",
        )
        assert client.post("/jobs/preempted/cancel").status_code == 200  # no relaunch needed

    listed = gpuopt("local", "list", "--all", data_dir=tmp_path)
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    names = header.split()
    assert names == ["INSTANCE", "STATE", "TYPE", "ZONE", "MARKET", "$/h", "JOB", "DETAIL"]
    left = [header.index(n) for n in names if n != "$/h"]
    price_end = header.index("$/h") + len("$/h")  # right-aligned: cells end where it ends
    for line in lines:
        assert line == line.rstrip()
        for at in left[1:]:
            assert line[at - 1] == " " and line[at] != " ", (header, line)
        assert line[price_end - 1] != " " and line[price_end] == " ", (header, line)
    rows = {}
    for line in lines:
        instance, state, *_, job, detail = cells(line, left)
        rows[instance] = (state, job, detail)
    assert rows[stopped] == ("terminated (by gpuopt)", "stopped #1", "terminated by gpuopt")
    state, job, detail = rows[preempted]
    assert (state, job) == ("terminated (preempted)", "preempted #1")
    assert detail.startswith("spot terminate at ")


def test_a_removed_jobs_instances_are_labelled_with_the_removed_job() -> None:
    """`train` was removed and submitted again: the old job's instances (job 3 in their launch
    keys) say they belong to the removed job, and only the new job's (job 8) read `train`."""
    from optimizer.cli.local import job_labels
    from providers.local.state import InstanceRecord

    def rec(iid: str, key: str, job: str, attempt: int) -> InstanceRecord:
        return InstanceRecord(
            id=iid, key=key, region="eu-west-1", zone="eu-west-1a", instance_type="g5.xlarge",
            market="spot", usd_per_hour=1.0, launched_at=0.0, job=job, attempt=attempt,
        )  # fmt: skip

    records = [
        rec("i-1", "3-1", "train", 1),
        rec("i-2", "3-2", "train", 2),
        rec("i-3", "8-1", "train", 1),
        rec("i-4", "5-1-n1", "other", 1),
        rec("i-5", "odd-key", "", 0),
    ]
    assert job_labels(records) == {
        "i-1": "train #1 (removed job 3)",
        "i-2": "train #2 (removed job 3)",
        "i-3": "train #1",
        "i-4": "other #1",
        "i-5": "odd-key",
    }
