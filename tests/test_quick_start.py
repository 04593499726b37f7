"""The quick start leads somewhere: the README's daemon starts with the example's policy
(`gpuopt policy add`), the example job runs under it without torch, and it trains long
enough for a person to interrupt it twice by hand."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from policies.loader import load_policy
from tests.helpers import run_gpuopt

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def quick_start() -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- ci:quickstart -->", 1)[1].split("```sh\n", 1)[1]
    return block.split("\n", 1)[0]


def test_the_quick_starts_daemon_has_the_policy_the_example_job_names() -> None:
    command = quick_start()
    added = re.search(r"gpuopt policy add (\S+)", command)
    assert added and command.index("policy add") < command.index("gpuopt daemon")
    job = yaml.safe_load((EXAMPLES / "train-job.yaml").read_text())
    assert load_policy(ROOT / added.group(1)).name == job["policy"]
    readme = (ROOT / "README.md").read_text()
    assert "source .venv/bin/activate" in readme  # how to put gpuopt on the PATH
    # The walk-through uses the quick start's daemon: no second `gpuopt daemon` on its port.
    walk = (EXAMPLES / "README.md").read_text()
    assert "already running" in walk and "export GPUOPT_DATA_DIR=/tmp/gpuopt-demo" not in walk


def test_the_example_job_runs_without_torch_and_lasts_for_two_interruptions() -> None:
    job = yaml.safe_load((EXAMPLES / "train-job.yaml").read_text())
    assert "import torch" not in job["setup"]
    # A Python with no site packages stands for an install without torch (-I -S: no
    # site-packages, no user site, no PYTHONPATH).
    setup = subprocess.run(
        ["/bin/sh", "-c", job["setup"].replace("python ", f"{sys.executable} -I -S ", 1)],
        cwd=EXAMPLES, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert setup.returncode == 0 and setup.stdout.strip() == "engine: numpy", setup.stderr
    run = job["run"].split()
    seconds = float(run[run.index("--steps") + 1]) * float(run[run.index("--step-sleep") + 1])
    # each interruption by hand: notice, a replacement's boot and probe, a restore (~1 min)
    assert seconds >= 240


def test_policy_add_copies_checks_and_never_overwrites_silently(tmp_path: Path) -> None:
    data = tmp_path / "data"
    policy = EXAMPLES / "local-train-policy.yaml"
    done = run_gpuopt(data, "policy", "add", str(policy))
    assert done.returncode == 0, done.stderr
    target = data / "policies" / "local-train.yaml"
    assert target.read_text() == policy.read_text()
    assert oct(target.parent.stat().st_mode & 0o777) == "0o700"
    assert run_gpuopt(data, "policy", "add", str(policy)).returncode == 0  # the same: fine
    edited = tmp_path / "edited.yaml"
    edited.write_text(policy.read_text().replace("monthly_usd: 500", "monthly_usd: 400"))
    refused = run_gpuopt(data, "policy", "add", str(edited))
    assert refused.returncode == 2 and "--force replaces it" in refused.stderr
    assert "monthly_usd: 500" in target.read_text()
    assert run_gpuopt(data, "policy", "add", str(edited), "--force").returncode == 0
    assert "monthly_usd: 400" in target.read_text()
    # Another file of the folder defining the same name is never doubled.
    target.rename(data / "policies" / "mine.yaml")
    twice = run_gpuopt(data, "policy", "add", str(policy))
    assert twice.returncode == 2 and "already defines policy 'local-train'" in twice.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: gpuopt/v1\nkind: Policy\nname: b\nbufer: 1\n")
    located = run_gpuopt(data, "policy", "add", str(bad))
    assert located.returncode == 2 and f"{bad}:4:1: bufer: unknown field" in located.stderr
