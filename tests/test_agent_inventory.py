"""`python -m optimizer.agent.inventory`: run as over SSH, and with NVML faked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer.agent.inventory import main
from optimizer.probes.nvml import NvmlUnavailable
from optimizer.probes.readings import GpuHealth, NodeHealth

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, *args: str, simulated: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUOPT_SIMULATED_GPUS"}
    env["PYTHONPATH"] = str(ROOT)
    env["CUDA_VISIBLE_DEVICES"] = ""
    if simulated is not None:
        env["GPUOPT_SIMULATED_GPUS"] = simulated
    return subprocess.run(
        [sys.executable, "-m", "optimizer.agent.inventory", "--dir", str(tmp_path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _no_nvml() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return True
    pynvml.nvmlShutdown()
    return False


needs_no_gpu = pytest.mark.skipif(not _no_nvml(), reason="NVML finds a GPU on this machine")


@needs_no_gpu
def test_simulated_gpus_on_a_machine_without_nvml(tmp_path: Path) -> None:
    done = _run(tmp_path, simulated="2xT4")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["simulated"] is True
    assert report["gpus"] == [
        {"index": 0, "model": "T4", "memory_mib": 16384, "uuid": "SIM-T4-0"},
        {"index": 1, "model": "T4", "memory_mib": 16384, "uuid": "SIM-T4-1"},
    ]
    assert report["disk_free_gib"] > 0
    assert report["python"] == sys.version.split()[0]
    assert report["hostname"] and report["gpuopt_version"]


@needs_no_gpu
def test_no_gpu_and_nothing_simulated_is_an_empty_list(tmp_path: Path) -> None:
    done = _run(tmp_path, simulated=None)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["gpus"], report["simulated"]) == ([], False)


@pytest.mark.parametrize(
    ("value", "says"), [("twoxT4", "COUNTxMODEL"), ("2xNoSuchGpu", "unknown GPU model")]
)
def test_a_bad_simulated_value_is_one_line_and_exit_2(
    tmp_path: Path, value: str, says: str
) -> None:
    done = _run(tmp_path, simulated=value)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "GPUOPT_SIMULATED_GPUS" in lines[0] and says in lines[0]


def test_a_bad_argument_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _run(tmp_path, "--frobnicate", simulated=None)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--frobnicate" in done.stderr


def test_the_memory_suffix_wins_over_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dir", str(tmp_path)], environ={"GPUOPT_SIMULATED_GPUS": "1xT4-15GB"},
                open_source=_unavailable) == 0  # fmt: skip
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert gpus == [{"index": 0, "model": "T4", "memory_mib": 15360, "uuid": "SIM-T4-0"}]


def _unavailable() -> _FakeNvml:
    raise NvmlUnavailable("no driver here")


class _FakeNvml:
    def __init__(self, *gpus: GpuHealth) -> None:
        self.gpus = gpus
        self.closed = False

    def snapshot(self) -> NodeHealth:
        return NodeHealth(gpus=self.gpus, device_count=len(self.gpus))

    def sample(self, t: float) -> list:  # type: ignore[type-arg]
        return []

    def start_xid_watch(self) -> None:
        pass

    def stop_xid_watch(self) -> list:  # type: ignore[type-arg]
        return []

    def close(self) -> None:
        self.closed = True


def test_nvml_gpus_are_named_as_the_probes_name_them_and_win_over_simulated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _FakeNvml(
        GpuHealth(0, name="NVIDIA H200", uuid="GPU-a", memory_total_bytes=150_754_820_096),
        GpuHealth(1, name="Tesla T4", uuid="GPU-b", memory_total_bytes=16 << 30),
    )
    env = {"GPUOPT_SIMULATED_GPUS": "4xT4"}
    assert main(["--dir", str(tmp_path)], environ=env, open_source=lambda: fake) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["simulated"] is False
    assert report["gpus"] == [
        {"index": 0, "model": "H200-141GB", "memory_mib": 143771, "uuid": "GPU-a"},
        {"index": 1, "model": "T4", "memory_mib": 16384, "uuid": "GPU-b"},
    ]
    assert fake.closed


def test_a_missing_folder_is_a_bad_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dir", str(tmp_path / "nope")], environ={}, open_source=_unavailable) == 2
    err = capsys.readouterr().err
    assert "nope" in err and len(err.strip().splitlines()) == 1


def test_why_nvml_could_not_start_is_reported_and_named_by_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A machine whose NVML cannot start (no driver, nvidia-ml-py missing) says why, and the
    check's refusal names it rather than only "no GPU"."""
    from providers.ssh.inventory import MachineSpec
    from providers.ssh.provider import judge

    assert main(["--dir", str(tmp_path)], environ={}, open_source=_unavailable) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == [] and report["nvml_error"] == "no driver here"
    spec = MachineSpec.model_validate(
        {
            "name": "box",
            "host": "10.0.0.5",
            "user": "ops",
            "region": "eu-central-1",
            "gpus": 1,
            "gpu_model": "H200",
            "tco": {"capex_usd": 40000},
        }
    )
    check = judge(spec, report, 0.0)
    assert not check.ok
    assert check.detail == "no GPU found (NVML: no driver here); simulate_gpus is off"
