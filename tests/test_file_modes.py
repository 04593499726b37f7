"""What the daemon, the local cloud and the agent create on disk is their owner's alone, whatever
the umask: folders 0700, logs 0600. A real daemon runs a real job on the local cloud under the
common umask 0o022 (which would leave 0755 folders and 0644 files)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from optimizer.clock import SteadyClock
from optimizer.common.files import append_private, private_dir
from tests.helpers import api, make_config, running, wait_until, write_policy
from tests.helpers.jobs import MID_MONTH, POLICY, e2e_cloud, state_of

pytestmark = pytest.mark.usefixtures("daemon_env")


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
def test_created_folders_are_0700_and_files_0600_and_existing_ones_keep_their_mode(
    tmp_path: Path,
) -> None:
    made = private_dir(tmp_path / "a" / "b" / "c")
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", made)] == [0o700] * 3
    with append_private(made / "new.log") as out:
        out.write(b"one\n")
    with append_private(made / "new.log") as out:
        out.write(b"two\n")
    assert mode(made / "new.log") == 0o600 and (made / "new.log").read_bytes() == b"one\ntwo\n"
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    (shared / "kept.log").write_bytes(b"")
    os.chmod(shared / "kept.log", 0o640)
    private_dir(shared)
    append_private(shared / "kept.log").close()
    assert mode(shared) == 0o755 and mode(shared / "kept.log") == 0o640


@pytest.mark.slow
@pytest.mark.usefixtures("umask_022")
def test_a_job_on_the_local_cloud_leaves_only_private_folders_and_logs(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    data = tmp_path / "home" / "gpuopt"  # nothing of it exists yet: the daemon makes it all
    policies = tmp_path / "etc" / "gpuopt" / "policies"
    clock = SteadyClock(MID_MONTH)
    config = make_config(data, policy_dir=policies, loops={"reconcile_s": 0.25})
    with (
        e2e_cloud(data, clock) as cloud,
        running(config, sources={"local": cloud}, clock=clock) as d,
    ):
        write_policy(policies, "local-eu.yaml", POLICY)
        wait_until(lambda: d.registry.get("local-eu") is not None, 10, "the policy loaded")
        for poll in d.polls:
            poll.run_once()
        job = {
            "name": "modes",
            "policy": "local-eu",
            "workdir": str(tmp_path),
            "run": "echo out; echo err >&2",
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "probes": "none",
        }
        with api(d) as client:
            assert client.post("/jobs", json=job).status_code == 201
        wait_until(lambda: state_of(d, "modes")["state"] == "succeeded", 60, "the job to end")
        [instance] = cloud.instances()

    disk = data / "local-cloud" / "instances" / instance.id
    agent = disk / "agent"
    assert (agent / "job.log").read_text().count("out") >= 1
    assert "err" in (agent / "job.err.log").read_text()
    folders = [tmp_path / "home", data, policies.parent, policies, data / "local-cloud"]
    folders += [data / "local-cloud" / "instances", disk, agent]
    assert {str(p): oct(mode(p)) for p in folders} == {str(p): "0o700" for p in folders}
    logs = [disk / "console.log", agent / "agent.log", agent / "job.log", agent / "job.err.log"]
    assert {str(p): oct(mode(p)) for p in logs} == {str(p): "0o600" for p in logs}
