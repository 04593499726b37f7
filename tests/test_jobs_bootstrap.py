"""The first-boot script: the agent's environment, an optional install, and a token that is
never printed, traced or handed to the install step."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer.jobs.bootstrap import DEFAULT_INSTALL, bootstrap_script

TOKEN = "tok-'quoted' $HOME `x`"


def stub_agent(tmp_path: Path) -> Path:
    """A fake interpreter: records how it was called and the environment it got."""
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\nenv > {tmp_path}/env\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return stub


def run(script: str, *sh_flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", *sh_flags, "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
        timeout=10,
        check=False,
    )


def test_the_script_starts_the_agent_with_its_environment(tmp_path: Path) -> None:
    script = bootstrap_script(
        daemon_url="http://10.0.0.1:8080",
        token=TOKEN,
        attempt_key="train/3",
        cloud="local",
        metadata_kind="aws-imds",
        install=None,
        python=str(stub_agent(tmp_path)),
        env={"GPUOPT_PROBE_CPU_N": "64"},
    )
    done = run(script)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "argv").read_text().split() == ["-m", "optimizer.agent"]
    env = dict(
        line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line
    )
    assert env["GPUOPT_AGENT_TOKEN"] == TOKEN  # quoting keeps it byte for byte
    assert env["GPUOPT_DAEMON_URL"] == "http://10.0.0.1:8080"
    assert env["GPUOPT_ATTEMPT_KEY"] == "train/3"
    assert env["GPUOPT_CLOUD"] == "local" and env["GPUOPT_PROBE_CPU_N"] == "64"
    assert env["GPUOPT_METADATA_KIND"] == "aws-imds"
    assert "pip install" not in script


def test_the_token_is_not_echoed_even_when_the_shell_traces(tmp_path: Path) -> None:
    script = bootstrap_script(
        daemon_url="http://d",
        token="s3cret-token",
        attempt_key="a/1",
        cloud="aws",
        metadata_kind="aws-imds",
        install=None,
        python=str(stub_agent(tmp_path)),
    )
    done = run(script, "-x")
    assert done.returncode == 0
    assert "s3cret-token" not in done.stdout + done.stderr
    assert script.count("s3cret-token") == 1


def test_the_install_step_runs_first_and_without_the_token(tmp_path: Path) -> None:
    script = bootstrap_script(
        daemon_url="http://d",
        token="s3cret-token",
        attempt_key="a/1",
        cloud="gcp",
        metadata_kind="gcp-metadata",
        install=f"env > {tmp_path}/install-env",
        python=str(stub_agent(tmp_path)),
    )
    assert run(script).returncode == 0
    seen = (tmp_path / "install-env").read_text()
    assert "GPUOPT_ATTEMPT_KEY=a/1" in seen and "s3cret-token" not in seen


def test_a_failing_install_stops_the_script_before_the_agent(tmp_path: Path) -> None:
    script = bootstrap_script(
        daemon_url="http://d",
        token="t",
        attempt_key="a/1",
        cloud="aws",
        metadata_kind="aws-imds",
        install="exit 7",
        python=str(stub_agent(tmp_path)),
    )
    assert run(script).returncode == 7
    assert not (tmp_path / "argv").exists()


def test_the_default_is_a_pip_install_and_the_console_script() -> None:
    script = bootstrap_script(
        daemon_url="http://d", token="t", attempt_key="a/1", cloud="aws", metadata_kind="aws-imds"
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh" and DEFAULT_INSTALL in lines
    assert lines[-1] == "exec gpuopt agent run"
    assert subprocess.run(["/bin/sh", "-n", "-c", script], check=False).returncode == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"token": "a\nb"},
        {"daemon_url": ""},
        {"metadata_kind": ""},
        {"env": {"GPUOPT_AGENT_TOKEN": "x"}},
        {"env": {"bad name": "x"}},
    ],
)
def test_values_that_could_break_the_script_are_refused(bad: dict) -> None:
    args = {
        "daemon_url": "http://d",
        "token": "t",
        "attempt_key": "a/1",
        "cloud": "aws",
        "metadata_kind": "aws-imds",
        **bad,
    }
    with pytest.raises(ValueError):
        bootstrap_script(**args)


def test_the_agent_and_the_local_cloud_load_without_torch() -> None:
    code = (
        "import sys, optimizer.agent, optimizer.cli.agent, optimizer.cli.local, providers.local\n"
        "print([m for m in ('torch', 'pynvml') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_the_agent_entry_loads_no_command_line_and_names_bad_settings(tmp_path: Path) -> None:
    code = (
        "import sys, optimizer.agent.start\n"
        "print(sorted(m for m in sys.modules if m == 'typer' or m.startswith('optimizer.cli')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    bad = subprocess.run(
        [sys.executable, "-m", "optimizer.agent"],
        capture_output=True,
        text=True,
        env={**env, "HOME": str(tmp_path)},
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("gpuopt: error: missing environment variable(s): GPUOPT_")
