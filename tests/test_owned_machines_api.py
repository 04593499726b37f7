"""`gpuopt machines` and /machines against a real daemon and a real sshd on loopback: a good
machine is added, checked and listed; bad ones are refused with one line that names the
problem (unreachable, wrong key, changed host key, GPUs that differ from the inventory, a
duplicate name), and nothing of a refused machine is kept."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.daemon.service import Daemon
from optimizer.ui.app import console_app
from optimizer.ui.render import price
from providers.base import ProviderSettings
from providers.ssh import SshConfig
from providers.ssh import build as build_owned
from tests.helpers.daemon import TOKEN, api, make_config, run_gpuopt, running
from tests.helpers.sshd import SshMachine, make_key, sshd

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]


def _python(simulate: str | None = None) -> str:
    """How the machine runs this gpuopt: this interpreter with this checkout first, and
    (`simulate`, e.g. "2xL4") GPUs the machine's inventory reports as if NVML had found them."""
    env = []
    if os.environ.get("PYTHONPATH"):
        env.append(f"PYTHONPATH={os.environ['PYTHONPATH']}")
    if simulate:
        env.append(f"GPUOPT_SIMULATED_GPUS={simulate}")
    return f"env {' '.join(env)} {sys.executable}" if env else sys.executable


@dataclass
class Site:
    daemon: Daemon
    client: httpx.Client
    machine: SshMachine
    key: Path
    known_hosts: Path
    data: Path

    def body(self, **change: Any) -> dict[str, Any]:
        """An add request for the machine, good unless `change` says otherwise."""
        machine = {
            "name": "gpu-a",
            "host": "127.0.0.1",
            "user": self.machine.target(self.key).user,
            "port": self.machine.port,
            "key_file": str(self.key),
            "region": "eu-central-1",
            "gpus": 2,
            "gpu_model": "T4",
            "python": _python(),
            "work_dir": str(self.data / "work"),
            "simulate_gpus": True,
            "tco": {"capex_usd": 2000.0},
        }
        machine.update(change)
        return {"machine": machine}

    def cli(self, *args: str) -> Any:
        env = {"GPUOPT_API_URL": self.daemon.url, "GPUOPT_API_TOKEN": TOKEN}
        return run_gpuopt(self.data / "cli", "machines", *args, env=env)

    def cli_add(self, *args: str, gpus: int = 2, model: str = "T4") -> Any:
        target = self.machine.target(self.key)
        return self.cli(
            "add",
            f"{target.user}@127.0.0.1",
            "--port",
            str(self.machine.port),
            "--key",
            str(self.key),
            "--region",
            "eu-central-1",
            "--gpus",
            str(gpus),
            "--gpu-model",
            model,
            "--capex-usd",
            "2000",
            *args,
        )

    def names(self) -> list[str]:
        return [m["name"] for m in self.client.get("/machines").json()["machines"]]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    key = make_key(tmp_path / "keys")
    with sshd(tmp_path / "sshd-a", "gpu-a", authorized=[key.with_suffix(".pub")]) as machine:
        known = tmp_path / "known_hosts"
        known.write_text(machine.known_hosts_line() + "\n")
        owned = {"machines": [], "known_hosts": str(known)}
        config = make_config(tmp_path / "daemon", providers={"ssh": owned})
        source = build_owned(
            ProviderSettings(config=SshConfig.model_validate(owned), data_dir=tmp_path / "daemon")
        )
        with (
            running(config, sources={"ssh": source}, face=console_app) as daemon,
            api(daemon) as client,
        ):
            yield Site(daemon, client, machine, key, known, tmp_path)


def _one_line(result: Any, *needles: str) -> str:
    """The CLI's refusal: a non-zero exit, nothing on stdout, one line on stderr naming each
    needle (no traceback)."""
    assert result.returncode != 0, result.stdout
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return str(result.stderr)


def test_a_good_machine_is_added_checked_and_listed(site: Site) -> None:
    added = site.client.post("/machines", json=site.body())
    assert added.status_code == 201, added.text
    view = added.json()
    assert (view["name"], view["gpus_free"], view["gpus_used"]) == ("gpu-a", 2, 0)
    assert view["usd_per_gpu_hour"] > 0  # priced by its TCO
    listed = site.cli("list")
    assert listed.returncode == 0, listed.stderr
    assert "gpu-a" in listed.stdout and "T4" in listed.stdout
    checked = site.cli("check", "gpu-a")
    assert checked.returncode == 0, checked.stderr
    assert "2x T4 (simulated)" in checked.stdout


def test_the_console_shows_each_machine_its_gpus_in_use_utilization_and_rate(
    site: Site,
) -> None:
    assert site.client.post("/machines", json=site.body()).status_code == 201
    rate = site.client.get("/machines").json()["machines"][0]["usd_per_gpu_hour"]
    with httpx.Client(base_url=site.daemon.url, timeout=10) as browser:
        assert browser.post("/ui/login", data={"token": TOKEN}).status_code == 303
        page = browser.get("/ui/machines")
        assert page.status_code == 200
        row = page.text.split('data-machine="gpu-a"')[1].split("</tr>")[0]
        assert "2x T4 (simulated)" in row and "0/2" in row
        assert "0.0%" in row  # held no GPU since it was first seen
        assert price(rate) in row  # the machine's TCO rate per GPU-hour
        assert site.client.post("/machines/gpu-a/drain", json={"in_s": 600}).status_code == 200
        row = browser.get("/ui/machines").text.split('data-machine="gpu-a"')[1]
        assert "draining until" in row.split("</tr>")[0]


def test_a_duplicate_name_is_refused_and_the_first_kept(site: Site) -> None:
    assert site.client.post("/machines", json=site.body()).status_code == 201
    again = site.client.post("/machines", json=site.body(port=site.machine.port + 1))
    assert again.status_code == 409
    assert "a machine named 'gpu-a' exists already" in again.json()["detail"]
    _one_line(site.cli_add("--name", "gpu-a"), "gpu-a", "exists already")
    assert site.names() == ["gpu-a"]


def test_an_unreachable_host_is_refused_naming_it(site: Site, tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    refused = site.client.post("/machines", json=site.body(port=closed))
    assert refused.status_code == 422
    assert f"127.0.0.1:{closed}" in refused.json()["detail"]
    assert site.names() == []


def test_a_key_the_machine_refuses_is_named(site: Site, tmp_path: Path) -> None:
    other = make_key(tmp_path / "other-keys")
    refused = site.client.post("/machines", json=site.body(key_file=str(other)))
    assert refused.status_code == 422
    detail = refused.json()["detail"]
    assert "127.0.0.1" in detail and str(site.machine.port) in detail
    assert "key" in detail.lower()
    assert site.names() == []


def test_an_unknown_host_key_is_refused_unless_pinned_explicitly(site: Site) -> None:
    site.known_hosts.write_text("")
    line = _one_line(site.cli_add("--name", "gpu-a"), "known_hosts")
    assert "--trust-new-host-key" in line or "trust" in line
    assert site.names() == []
    pinned = site.cli_add("--name", "gpu-a", "--python", _python("2xT4"), "--trust-new-host-key")
    assert pinned.returncode == 0, pinned.stderr
    assert site.machine.known_hosts_line().split()[-1] in site.known_hosts.read_text()


def test_a_changed_host_key_is_refused_clearly_and_the_machine_offers_nothing(
    site: Site,
) -> None:
    assert site.client.post("/machines", json=site.body()).status_code == 201
    site.machine.regenerate_host_key()
    site.machine.restart()
    line = _one_line(site.cli("check", "gpu-a"), "gpu-a")
    assert "changed" in line.lower() and "host key" in line.lower()
    [view] = site.client.get("/machines").json()["machines"]
    assert view["state"] == "failed" and "changed" in (view["check"] or "").lower()
    # The same host and port under another name is the same machine.
    again = site.client.post(
        "/machines", json={**site.body(name="gpu-a2"), "trust_new_host_key": True}
    )
    assert again.status_code == 409
    assert f"127.0.0.1:{site.machine.port} is machine 'gpu-a' already" in again.json()["detail"]


def test_gpus_that_differ_from_the_inventory_are_refused_naming_both(site: Site) -> None:
    # The machine reports two L4s; the inventory says two T4s.
    body = site.body(simulate_gpus=False, python=_python("2xL4"))
    refused = site.client.post("/machines", json=body)
    assert refused.status_code == 422
    assert "the inventory says 2x T4, the machine has 2x L4" in refused.json()["detail"]
    # Through the CLI: a machine whose NVML finds no GPU at all.
    _one_line(site.cli_add("--name", "gpu-a", "--python", _python()), "gpu-a", "no GPU found")
    assert site.names() == []


def test_freed_gpus_end_the_owned_pools_cooldowns_and_taken_ones_do_not(
    tmp_path: Path,
) -> None:
    """A launch that found no free GPU cooled its owned pool; when the provider says GPUs
    were freed (an end, an undrain), the daemon ends its pools' cooldowns at once, and only
    its own; a launch (GPUs taken) ends none."""
    from datetime import timedelta

    from optimizer.model import Pool

    owned = {"machines": []}
    config = make_config(tmp_path / "daemon", providers={"ssh": owned})
    source = build_owned(
        ProviderSettings(config=SshConfig.model_validate(owned), data_dir=tmp_path / "daemon")
    )
    with running(config, sources={"ssh": source}) as daemon:
        daemon.handles["ssh"].source()  # as a poll or a launch gets it: the hook is wired
        now = daemon.clock()
        mine = Pool("ssh", "eu-central-1", "fra-lab", "owned-1xT4", "owned")
        theirs = Pool("local", "eu-north-1", "eu-north-1-b", "g4dn.xlarge", "spot")
        for pool in (mine, theirs):
            daemon.store.jobs.add_cooldown(pool, now + timedelta(minutes=10), "no capacity")
        source.offers_changed(False)  # GPUs taken: nothing ends
        assert daemon.store.jobs.cooled_pools(daemon.clock()) == {mine, theirs}
        source.offers_changed(True)
        assert daemon.store.jobs.cooled_pools(daemon.clock()) == {theirs}
