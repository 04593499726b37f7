"""The `ssh` provider against a real sshd on loopback, below the daemon: terminating an
instance ends all of it (the job in a session of its own included), and a machine that goes
away ends its instances once it has been unreachable `lost_after_s`, offers nothing meanwhile,
and, when it answers again, has whatever still ran there stopped."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from providers.base import EndReason, InstanceRef, InstanceState, LaunchSpec
from providers.ssh import SshConfig
from providers.ssh.provider import SshProvider
from tests.helpers.sshd import SshMachine, instance_processes, make_key, reap_instances, sshd
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.slow

# What the instance runs in place of the agent: a "job" in a session of its own (as the
# agent starts one), then a long wait.
BOOTSTRAP = "#!/bin/sh\nsetsid sleep 600 < /dev/null > /dev/null 2>&1 &\nexec sleep 600\n"


def _python() -> str:
    path = os.environ.get("PYTHONPATH")
    return f"env PYTHONPATH={path} {sys.executable}" if path else sys.executable


@dataclass
class Owned:
    provider: SshProvider
    machine: SshMachine
    work: Path
    now: list[float]


@pytest.fixture
def owned(tmp_path: Path) -> Iterator[Owned]:
    key = make_key(tmp_path / "keys")
    work = tmp_path / "work"
    with sshd(tmp_path / "sshd", "gpu-a", authorized=[key.with_suffix(".pub")]) as machine:
        known = tmp_path / "known_hosts"
        known.write_text(machine.known_hosts_line() + "\n")
        config = SshConfig.model_validate(
            {
                "machines": [
                    {
                        "name": "gpu-a",
                        "host": "127.0.0.1",
                        "user": machine.target(key).user,
                        "port": machine.port,
                        "key_file": str(key),
                        "region": "eu-central-1",
                        "gpus": 2,
                        "gpu_model": "T4",
                        "python": _python(),
                        "work_dir": str(work),
                        "simulate_gpus": True,
                    }
                ],
                "known_hosts": str(known),
                "lost_after_s": 60,
                "connect_timeout_s": 3,
            }
        )
        now = [1_800_000_000.0]
        provider = SshProvider(config, tmp_path / "state", rate=lambda m: 0.1, clock=lambda: now[0])
        try:
            assert provider.check("gpu-a").ok
            yield Owned(provider, machine, work, now)
        finally:
            provider.close()
            reap_instances(work)


def _launch(owned: Owned, key: str) -> InstanceRef:
    [offer] = [o for o in owned.provider.fetch_offers() if o.gpu_count == 1]
    return owned.provider.launch(offer, LaunchSpec("train", 1, BOOTSTRAP), key)


def test_terminate_ends_the_agent_and_the_job_in_its_own_session(owned: Owned) -> None:
    ref = _launch(owned, "k1")
    wait_until(lambda: len(instance_processes(owned.work)) == 2, 15, "the agent and its job")
    owned.provider.terminate(ref)
    assert instance_processes(owned.work) == []  # SIGTERM, then SIGKILL by the mark
    [status] = owned.provider.describe([ref])
    assert status.state is InstanceState.TERMINATED and status.end_reason is EndReason.USER
    assert {o.gpu_count for o in owned.provider.fetch_offers()} == {1, 2}  # GPUs free again


def test_a_machine_gone_ends_its_instances_and_stops_them_when_it_answers_again(
    owned: Owned,
) -> None:
    ref = _launch(owned, "k1")
    wait_until(lambda: len(instance_processes(owned.work)) == 2, 15, "the agent and its job")
    owned.machine.stop()  # cut off: what runs there goes on
    [status] = owned.provider.describe([ref])
    assert status.state is InstanceState.RUNNING  # not known gone yet
    [view] = owned.provider.views()
    assert view.check is not None and not view.check.ok and "unreachable" in view.check.detail
    assert owned.provider.fetch_offers() == []  # it offers nothing meanwhile

    owned.now[0] += 45  # tried again (it is retried each 30 s at most): still unreachable
    [status] = owned.provider.describe([ref])
    assert status.state is InstanceState.RUNNING
    owned.now[0] += 16  # past lost_after_s, between two tries: it is gone all the same
    [status] = owned.provider.describe([ref])
    assert status.state is InstanceState.TERMINATED and status.end_reason is EndReason.FAILED
    assert "machine gpu-a unreachable for 61 s" in (status.detail or "")
    assert len(instance_processes(owned.work)) == 2  # still running there, cut off

    owned.machine.start()
    owned.now[0] += 1
    offers = owned.provider.fetch_offers()  # the check reaches it again
    assert {o.gpu_count for o in offers} == {1, 2}  # both GPUs free
    assert instance_processes(owned.work) == []  # what ran there, cut off, was stopped
