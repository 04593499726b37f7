"""The agent's bootstrap from the daemon config's `agent:` section: what it renders, that it
installs gpuopt from a wheel and registers when run as a process against the local cloud's
metadata server, and that the offer's GPU count is what the probe expects."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from optimizer import __version__
from optimizer.agent import AgentConfig
from optimizer.daemon.config import AgentSetupConfig
from optimizer.jobs.bootstrap import AgentInstall, AgentProxy, AgentSettings
from providers.local import LocalCloud
from tests.helpers import wait_until
from tests.helpers.agent import AGENT_FIXTURES, FAST, FakeDaemon, launch_on

ROOT = Path(__file__).resolve().parents[1]


def render(agent: AgentSettings, **kwargs: Any) -> str:
    values: dict[str, Any] = {
        "daemon_url": "http://127.0.0.1:1",
        "token": "t" * 43,
        "attempt_key": "1-1",
        "cloud": "aws",
        "metadata_kind": "aws-imds",
        **kwargs,
    }
    return agent.script(**values)


# -- rendering --------------------------------------------------------------------------------


def test_the_default_install_makes_a_venv_and_runs_the_agent_from_it() -> None:
    script = render(AgentSettings(), expected_gpus=8)
    lines = script.splitlines()
    install = next(line for line in lines if "pip install" in line)
    assert install == (
        "{ [ -x /opt/gpuopt/bin/python ] || python3 -m venv /opt/gpuopt; } && "
        "/opt/gpuopt/bin/python -m pip install --quiet --disable-pip-version-check "
        "'gpuopt[probes]'"
    )
    assert "export GPUOPT_EXPECTED_GPUS=8" in lines
    # installed before the token exists, and the agent runs from the venv
    assert lines.index(install) < next(i for i, x in enumerate(lines) if "AGENT_TOKEN=" in x)
    assert lines[-1] == "exec /opt/gpuopt/bin/python -m optimizer.agent"


def test_a_wheel_an_index_and_a_proxy_are_rendered_for_pip_and_the_agent() -> None:
    agent = AgentSettings(
        install=AgentInstall(
            wheel_url="file:///srv/wheels/gpuopt-0.4.1-py3-none-any.whl",
            index_url="https://pypi.internal/simple",
            extras=(),
        ),
        proxy=AgentProxy(http="http://proxy:3128", https="http://proxy:3128", no_proxy=("10.1",)),
    )
    script = render(agent)
    assert (
        "--index-url https://pypi.internal/simple "
        "'gpuopt @ file:///srv/wheels/gpuopt-0.4.1-py3-none-any.whl'" in script
    )
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        assert f"export {name}=http://proxy:3128\n" in script
    assert "export NO_PROXY=10.1,169.254.169.254,metadata.google.internal\n" in script


def test_an_instance_on_this_host_installs_nothing_and_expects_no_gpus() -> None:
    script = render(AgentSettings(install=AgentInstall(version="9.9")), on_host=True)
    assert "pip" not in script and "GPUOPT_EXPECTED_GPUS" not in script
    assert script.endswith(f"exec {sys.executable} -m optimizer.agent\n")


def _stub_venv(tmp_path: Path) -> tuple[AgentInstall, Path]:
    """A venv whose Python logs its arguments, runs `-c` checks with this interpreter (which
    imports this gpuopt) and succeeds at anything else (pip) without doing it."""
    venv, log = tmp_path / "venv", tmp_path / "calls"
    (venv / "bin").mkdir(parents=True)
    stub = venv / "bin" / "python"
    stub.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        f'if [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\nexit 0\n'
    )
    stub.chmod(0o755)
    return AgentInstall(venv=str(venv), prebaked=True), log


@pytest.mark.parametrize(
    ("version", "pip_runs"), [(None, False), (__version__, False), ("9.9", True)]
)
def test_a_prebaked_image_skips_pip_where_its_gpuopt_is_there(
    tmp_path: Path, version: str | None, pip_runs: bool
) -> None:
    install, log = _stub_venv(tmp_path)
    install = dataclasses.replace(install, version=version)
    done = subprocess.run(["sh", "-eu", "-c", install.command()], timeout=60, check=False)
    assert done.returncode == 0
    calls = log.read_text().splitlines()
    assert calls[0].startswith("-c import")
    assert any("-m pip install" in c for c in calls) is pip_runs
    if pip_runs:
        assert calls[-1].endswith("gpuopt[probes]==9.9")


def test_prebaked_comes_from_the_daemon_config() -> None:
    section = AgentSetupConfig.model_validate({"install": {"prebaked": True, "version": "0.4.1"}})
    assert section.settings().install.prebaked is True
    assert AgentSetupConfig().settings().install.prebaked is False
    assert " || { " not in AgentInstall().command()


@pytest.mark.parametrize(
    "install",
    [
        AgentInstall(version="1.0\nrm -rf /"),
        AgentInstall(extras=("probes]; rm -rf /",)),
        AgentInstall(venv=""),
    ],
)
def test_an_install_that_would_break_the_script_is_refused(install: AgentInstall) -> None:
    with pytest.raises(ValueError):
        render(AgentSettings(install=install))


def test_the_agent_reads_the_offers_gpu_count() -> None:
    env = {
        "GPUOPT_DAEMON_URL": "http://d",
        "GPUOPT_AGENT_TOKEN": "t",
        "GPUOPT_ATTEMPT_KEY": "k",
        "GPUOPT_METADATA_KIND": "aws-imds",
    }
    assert AgentConfig.from_env(env).expected_gpus is None
    assert AgentConfig.from_env({**env, "GPUOPT_EXPECTED_GPUS": "8"}).expected_gpus == 8


# -- as processes on the local cloud ----------------------------------------------------------


cloud, daemon = AGENT_FIXTURES


def test_an_instance_with_fewer_gpus_than_the_offer_fails_its_probe(
    cloud: LocalCloud, daemon: FakeDaemon, tmp_path: Path
) -> None:
    """The job names no `expected_gpus`: the offer's count (64, which no machine here has) is
    what the probe checks, so the job never starts."""

    daemon.stop_on_failed_probe()
    job = {
        "name": "train",
        "run": "echo should-not-run",
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "probes": "quick",
    }
    token = "p" * 43
    daemon.add_attempt("train/1", token, job)
    agent = AgentSettings(env={**FAST, "GPUOPT_PROBE_CPU_N": "64"})
    script = render(
        agent,
        daemon_url=daemon.url,
        token=token,
        attempt_key="train/1",
        cloud="local",
        on_host=True,
    ).replace(  # the local cloud's host has no 64 GPUs: the offer's count, as on a cloud
        "export GPUOPT_CLOUD=", "export GPUOPT_EXPECTED_GPUS=64\nexport GPUOPT_CLOUD="
    )
    launch_on(cloud, script, "train/1")
    wait_until(lambda: "probe_result" in daemon.kinds(), timeout=40, what="probe_result")
    probe = daemon.of_kind("probe_result")[0]["data"]
    count = next(c for c in probe["result"]["checks"] if c["name"] == "gpu.count")
    assert probe["status"] == "fail" and count["status"] == "fail"
    wait_until(lambda: "stopped" in daemon.kinds(), timeout=20, what="stopped")
    assert "job_started" not in daemon.kinds()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this checkout, built once per session in a copy (no build/ in the tree)."""
    try:
        import setuptools  # noqa: F401
    except ImportError:
        pytest.skip("setuptools is not installed: cannot build a wheel of gpuopt")
    src = tmp_path_factory.mktemp("wheel-src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("optimizer", "policies", "providers"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    built = subprocess.run(
        [*command, "--disable-pip-version-check", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [found] = out.glob("gpuopt-*.whl")
    return found


def prepared_venv(path: Path) -> Path:
    """A virtual environment that already holds gpuopt's dependencies (the image's, offline):
    this interpreter's site-packages without gpuopt itself, linked in through a .pth file."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    deps = path / "deps"
    deps.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        name = entry.name.lower()
        if "gpuopt" in name or name.startswith("__editable__") or entry.suffix == ".pth":
            continue
        (deps / entry.name).symlink_to(entry)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "gpuopt-test-deps.pth").write_text(f"{deps}\n")
    return path


def test_the_cloud_bootstrap_installs_from_a_wheel_and_registers(
    cloud: LocalCloud,
    daemon: FakeDaemon,
    wheel: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The script an AWS instance gets, run as a process against the local metadata server:
    pip installs gpuopt from the wheel into the venv, and that gpuopt's agent registers."""
    monkeypatch.delenv("PYTHONPATH", raising=False)  # only the installed gpuopt may answer
    venv = prepared_venv(tmp_path / "venv")
    job = {
        "name": "train",
        "run": "echo hello-from-the-job",
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "probes": "none",
    }
    token = "w" * 43
    daemon.add_attempt("train/1", token, job)
    agent = AgentSettings(
        install=AgentInstall(wheel_url=wheel.as_uri(), extras=(), venv=str(venv)),
        env={**FAST, "PIP_NO_INDEX": "1"},  # offline: every dependency is in the venv already
    )
    script = render(agent, daemon_url=daemon.url, token=token, attempt_key="train/1")
    ref = launch_on(cloud, script, "train/1")
    wait_until(lambda: daemon.registrations, timeout=120, what="the agent registers")
    wait_until(lambda: "job_exited" in daemon.kinds(), timeout=60, what="the job exits")
    registration = daemon.registrations[0]
    assert registration["instance_id"] == ref.instance_id  # read from the local IMDS
    purelib = next((venv / "lib").glob("python3*/site-packages"))
    assert (purelib / "optimizer" / "cli" / "__main__.py").is_file()
    assert next(purelib.glob("gpuopt-*.dist-info"))
