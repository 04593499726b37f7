"""Job spec files: valid ones load, bad ones get located errors."""

from __future__ import annotations

import pytest

from optimizer.jobs.spec import JobSpecError, parse_job_spec

GOOD = """\
name: train-resnet
policy: resnet50-training
run: python train.py
checkpoint_dir: /tmp/ckpt
env: {WANDB_PROJECT: resnet}
"""


def test_minimal_spec_and_defaults() -> None:
    spec = parse_job_spec(GOOD)
    assert spec.name == "train-resnet" and spec.policy == "resnet50-training"
    assert spec.probes == "quick" and spec.setup is None and spec.max_restarts is None
    assert spec.env == {"WANDB_PROJECT": "resnet"}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("probes: thorough\n", "j.yaml:5:9: probes: must be 'quick', 'deep' or 'none'"),
        ("max_restarts: -1\n", "j.yaml:5:15: max_restarts: must be >= 0"),
        ("retries: 3\n", "j.yaml:5:1: retries: unknown field"),
        ("env: {GPUOPT_RESTARTS: '9'}\n", "env: GPUOPT_RESTARTS is set by gpuopt"),
        ("env: {'1BAD': x}\n", "is not an environment variable name"),
        ("env: {N: 3}\n", "env.N: must be text"),
    ],
)
def test_bad_fields_are_located(extra: str, expected: str) -> None:
    text = GOOD.replace("env: {WANDB_PROJECT: resnet}\n", "") + extra
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(text, path="j.yaml")
    assert any(expected in str(p) for p in caught.value.problems), caught.value.problems


def test_missing_fields_and_blank_command() -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec("name: x\nrun: '  '\n", path="j.yaml")
    found = [str(p) for p in caught.value.problems]
    assert "j.yaml:2:6: run: must not be blank" in found
    assert any("policy: required field is missing" in p for p in found)
    assert any("checkpoint_dir: required field is missing" in p for p in found)
