"""Owned machines end to end: two machines reached over a real sshd each (real keys, host keys
checked), two simulated T4 apiece, beside the local cloud. Six jobs of a policy that owns
first: four run on the owned GPUs (never two on one GPU), two burst to the local cloud.
Draining one machine moves its jobs by the hot handover with no lost step; once it returns,
a burst job comes back to it under the policy's migration rules. The ledger bills the owned
attempts at the machines' TCO rate, per second, matching a computation by hand from the
provider's own record of when each instance ran."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from optimizer.daemon.service import Daemon
from providers.base import ProviderSettings
from providers.ssh import SshConfig
from providers.ssh import build as build_owned
from tests.helpers.cloud import local_cloud
from tests.helpers.code import ship
from tests.helpers.daemon import api, make_config, running
from tests.helpers.jobs import job_body
from tests.helpers.policies import write_policy
from tests.helpers.sshd import SshMachine, instance_processes, make_key, reap_instances, sshd
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: own-first
workload: {gpus: 1, gpu_memory_gib: 12}
markets: [owned, spot]
placement: {providers: [ssh, local], compliance: eu}
recovery: {max_restarts: 20, on_demand_after_interruptions: 100}
migration: {enabled: true, min_savings: 0.25, min_stable: 0, min_runtime: 0, max_per_day: 20,
  disruption_budget: 6}
"""
# A cheap machine: $2,000 over 3 years, 200 W; its rate is far under any spot T4's.
TCO = {"capex_usd": 2000.0, "life_years": 3.0, "power_kw": 0.2}


def _python() -> str:
    """How the machines run this gpuopt: this interpreter, with this checkout first."""
    path = os.environ.get("PYTHONPATH")
    return f"env PYTHONPATH={path} {sys.executable}" if path else sys.executable


def _machine(m: SshMachine, key: Path, work: Path) -> dict[str, Any]:
    return {
        "name": m.name,
        "host": "127.0.0.1",
        "user": m.target(key).user,
        "port": m.port,
        "key_file": str(key),
        "region": "eu-central-1",
        "site": "fra-lab",
        "gpus": 2,
        "gpu_model": "T4",
        "gpu_memory_gib": 16,
        "python": _python(),
        "work_dir": str(work / m.name),
        "simulate_gpus": True,
        "tco": TCO,
    }


def _attempts(daemon: Daemon) -> list[Any]:
    return [a for j in daemon.store.jobs.list_jobs() for a in daemon.store.jobs.attempts(j.id)]


def _running(daemon: Daemon, provider: str) -> list[Any]:
    return [
        a
        for a in _attempts(daemon)
        if a.provider == provider and a.job_started_at is not None and not a.ended
    ]


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[tuple[Path, list[SshMachine]]]:
    key = make_key(tmp_path / "keys")
    pub = key.with_suffix(".pub")
    with (
        sshd(tmp_path / "sshd-a", "gpu-a", authorized=[pub]) as a,
        sshd(tmp_path / "sshd-b", "gpu-b", authorized=[pub]) as b,
    ):
        try:
            yield key, [a, b]
        finally:
            reap_instances(tmp_path / "work")  # whatever the test left running there


def test_own_first_burst_drain_and_return(
    tmp_path: Path, machines: tuple[Path, list[SshMachine]]
) -> None:
    key, (a, b) = machines
    known = tmp_path / "known_hosts"
    known.write_text(a.known_hosts_line() + "\n" + b.known_hosts_line() + "\n")
    owned_config = {
        "machines": [_machine(m, key, tmp_path / "work") for m in (a, b)],
        "known_hosts": str(known),
    }
    write_policy(tmp_path / "policies", "own-first.yaml", POLICY)
    agent_env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    config = make_config(
        tmp_path / "daemon",
        policy_dir=tmp_path / "policies",
        providers={"ssh": owned_config},
        loops={"reconcile_s": 0.25},
        agent={"install": {"venv": sys.prefix, "prebaked": True}, "env": agent_env},
    )
    owned = build_owned(
        ProviderSettings(
            config=SshConfig.model_validate(owned_config), data_dir=tmp_path / "daemon"
        )
    )
    ckpt = tmp_path / "bucket"
    with (
        local_cloud(tmp_path / "cloud", grace_s=30, terminate_grace_s=2.0, tick_s=0.05) as cloud,
        running(config, sources={"local": cloud, "ssh": owned}) as daemon,
        api(daemon) as client,
    ):
        for poll in daemon.polls:
            poll.run_once()
        ship(daemon)
        names = [f"job{n}" for n in range(1, 7)]
        for name in names:
            body = job_body(name, ckpt / name, steps=10_000_000, policy="own-first")
            # Six jobs on two cores: a step each 0.1 s, a checkpoint each 2 s.
            body["run"] = body["run"].replace("--checkpoint-every 5", "--checkpoint-every 20")
            body["run"] = body["run"].replace("--step-sleep 0.02", "--step-sleep 0.1")
            # Expected to run a day: moving back to a cheaper owned GPU pays at once (the
            # migration weighs the saving over what is left against the restart overhead).
            body["max_duration"] = "24h"
            assert client.post("/jobs", json=body).status_code == 201, name

        # Four jobs on the owned GPUs, two burst to the local cloud.
        wait_until(lambda: len(_running(daemon, "ssh")) == 4, 120, "four jobs on owned GPUs")
        wait_until(lambda: len(_running(daemon, "local")) == 2, 120, "two jobs burst to local")
        state = json.loads((tmp_path / "daemon" / "ssh" / "state.json").read_text())
        live = [i for i in state["instances"].values() if i["ended_at"] is None]
        held = [(i["machine"], g) for i in live for g in i["gpus"]]
        assert sorted(held) == [("gpu-a", 0), ("gpu-a", 1), ("gpu-b", 0), ("gpu-b", 1)]
        machines_view = client.get("/machines").json()["machines"]
        assert [(m["name"], m["gpus_free"], m["gpus_used"]) for m in machines_view] == [
            ("gpu-a", 0, 2),
            ("gpu-b", 0, 2),
        ]

        # Take gpu-a back in 20 s: its two jobs move (no owned GPU is free: to the cloud).
        on_a = {a_.job_id for a_ in _running(daemon, "ssh") if a_.instance_id.startswith("gpu-a")}
        drained = client.post("/machines/gpu-a/drain", json={"in_s": 20})
        assert drained.status_code == 200, drained.text
        assert len(drained.json()["told"]) == 2

        def moved() -> bool:
            now_on = {a_.job_id: a_ for a_ in _running(daemon, "local")}
            return on_a <= set(now_on) and not any(
                a_.instance_id.startswith("gpu-a") for a_ in _running(daemon, "ssh")
            )

        wait_until(moved, 120, "gpu-a's jobs running on the local cloud")
        for job_id in on_a:
            rows = daemon.store.jobs.attempts(job_id)
            old = next(r for r in rows if r.provider == "ssh")
            assert old.notice_at is not None  # the drain came as an interruption notice
        _no_step_lost(daemon, on_a)

        # gpu-a returns: a burst job comes back to it (the owned offer is far cheaper).
        back = client.post("/machines/gpu-a/undrain")
        assert back.status_code == 200, back.text
        wait_until(
            lambda: any(a_.instance_id.startswith("gpu-a") for a_ in _running(daemon, "ssh")),
            180,
            "a job moved back onto gpu-a",
        )
        for name in names:
            client.post(f"/jobs/{name}/cancel")
        wait_until(
            lambda: not [a_ for a_ in _attempts(daemon) if not a_.ended], 120, "every attempt ended"
        )
        # Ending an owned instance ends all of it: the agent and the job it ran in a session
        # of its own.
        work = tmp_path / "work"
        wait_until(lambda: not instance_processes(work), 30, "every owned process gone")
        # The ledger: the owned attempts at their TCO rate, per second, no minimum.
        state = json.loads((tmp_path / "daemon" / "ssh" / "state.json").read_text())
        by_hand = sum(
            i["usd_per_hour"] * (i["ended_at"] - i["started_at"]) / 3600
            for i in state["instances"].values()
        )
        groups = client.get("/costs", params={"by": "provider"}).json()
        owned_total = next(g for g in groups if g["group"] == "ssh")
        count = len(state["instances"])
        rate = max(i["usd_per_hour"] for i in state["instances"].values())
        assert owned_total["spend_usd"] == pytest.approx(by_hand, abs=count * rate * 2 / 3600)
        assert owned_total["markets"].get("owned") is not None


def _no_step_lost(daemon: Daemon, job_ids: set[int]) -> None:
    """Each moved job's new attempt restored the checkpoint its owned attempt committed last
    (its final one, written in the checkpoint window the drain gave): no step is lost."""
    for job_id in job_ids:
        rows = daemon.store.jobs.attempts(job_id)
        old = next(r for r in rows if r.provider == "ssh")
        new = next(r for r in rows if r.number > old.number and r.provider == "local")
        mine = [c for c in daemon.store.checkpoints.checkpoints(job_id) if c.attempt_id == old.id]
        assert mine, f"job {job_id}: its owned attempt committed no checkpoint"
        last = max(mine, key=lambda c: c.step or 0)
        restores = {r.attempt_id: r for r in daemon.store.checkpoints.restores(job_id)}
        assert new.id in restores, f"job {job_id}: attempt {new.number} restored nothing"
        assert restores[new.id].checkpoint_name == last.name
