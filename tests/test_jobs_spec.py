"""Job spec files: valid ones load, bad ones get located errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from optimizer.jobs.spec import JobSpecError, from_stored, job_spec, parse_job_spec, stored_form
from optimizer.store import JobRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)

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
    assert spec.checkpoint_allowance_s == 20


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("probes: thorough\n", "j.yaml:5:9: probes: must be 'quick', 'deep' or 'none'"),
        ("max_restarts: -1\n", "j.yaml:5:15: max_restarts: must be >= 0"),
        ("retries: 3\n", "j.yaml:5:1: retries: unknown field"),
        ("env: {GPUOPT_RESTARTS: '9'}\n", "env: GPUOPT_RESTARTS is set by gpuopt"),
        ("env: {'1BAD': x}\n", "is not an environment variable name"),
        ("env: {N: 3}\n", "env.N: must be text"),
        ("checkpoint_allowance_s: 0\n", "j.yaml:5:25: checkpoint_allowance_s: must be > 0"),
        ("checkpoint_allowance_s: soon\n", "j.yaml:5:25: checkpoint_allowance_s:"),
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
    assert found == ["j.yaml:2:6: run: must not be blank"]  # a policy is optional
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec("policy: p\n", path="j.yaml")
    found = [str(p) for p in caught.value.problems]
    assert any("name: required field is missing" in p for p in found)
    assert any("run: required field is missing" in p for p in found)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('env: {TOKEN: "ab\\0cd"}\n', "j.yaml:5:14: env.TOKEN: must not contain a NUL byte"),
        ('setup: "pip\\0install"\n', "j.yaml:5:8: setup: must not contain a NUL byte"),
    ],
)
def test_nul_bytes_are_rejected(extra: str, expected: str) -> None:
    # exec() would cut the value at the NUL: the job could never run as written.
    text = GOOD.replace("env: {WANDB_PROJECT: resnet}\n", "") + extra
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(text, path="j.yaml")
    assert expected in [str(p) for p in caught.value.problems], caught.value.problems


def test_run_over_64_kib_is_rejected() -> None:
    limit = 64 * 1024
    at_limit = GOOD.replace("run: python train.py", "run: " + "x" * limit)
    assert len(parse_job_spec(at_limit).run) == limit
    # Bytes, not characters: 32 769 two-byte characters are one byte over.
    over = GOOD.replace("run: python train.py", "run: " + "é" * (limit // 2 + 1))
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(over, path="j.yaml")
    assert [str(p) for p in caught.value.problems] == [
        "j.yaml:3:6: run: is 65538 bytes; at most 65536 (64 KiB) are allowed"
    ]


def test_more_than_256_env_keys_is_rejected() -> None:
    def spec(count: int) -> str:
        pairs = ", ".join(f"V{i}: x" for i in range(count))
        return GOOD.replace("env: {WANDB_PROJECT: resnet}", "env: {" + pairs + "}")

    assert len(parse_job_spec(spec(256)).env) == 256
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(spec(257), path="j.yaml")
    assert [str(p) for p in caught.value.problems] == [
        "j.yaml:5:6: env: has 257 variables; at most 256 are allowed"
    ]


def test_a_spec_file_takes_the_submitters_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # `gpuopt jobs submit` reads the file where the user runs it and sends the result: the
    # variables are the submitter's own, never the daemon's (the API takes JSON, read as is).
    monkeypatch.setenv("RUN_ID", "r42")
    spec = parse_job_spec(GOOD + "workdir: /work/${RUN_ID}\n")
    assert spec.workdir == "/work/r42"


FULL = (
    GOOD
    + "setup: pip install -r req.txt\nprobes: deep\nmax_restarts: 3\n"
    + "checkpoint_allowance_s: 45\nmax_duration: 2h\nnodes: 2\n"
    + "utilization:\n  idle: {below: 0.05, for: 20m, action: stop}\n"
)


@pytest.mark.parametrize("text", [GOOD, FULL])
def test_a_stored_spec_reads_back_as_the_spec_submitted(text: str) -> None:
    spec = parse_job_spec(text)
    stored = json.loads(json.dumps(stored_form(spec)))  # as the store keeps it: JSON
    assert "name" not in stored and "policy" not in stored  # the job's row holds them
    assert from_stored(stored, name=spec.name, policy=spec.policy) == spec


def test_a_spec_stored_by_an_earlier_version_reads_with_todays_defaults() -> None:
    """Fields it predates take their defaults; keys no longer known are ignored; a value
    that no longer passes reads as its default, and one without a default as stored."""
    old = {"run": "python train.py", "checkpoint_dir": "/ckpt", "gone_field": 1}
    spec = from_stored(old, name="train", policy="p")
    assert (spec.probes, spec.checkpoint_allowance_s, spec.env) == ("quick", 20.0, {})
    assert spec.nodes is None and spec.max_restarts is None
    odd = from_stored({**old, "probes": "thorough", "nodes": 0}, name="train", policy="p")
    assert (odd.run, odd.probes, odd.nodes) == ("python train.py", "quick", None)
    blank = from_stored({**old, "run": " "}, name="train", policy="p")
    assert blank.run == " " and blank.probes == "quick"  # taken as stored, never refused


def test_a_stored_jobs_spec_comes_from_its_row() -> None:
    spec = parse_job_spec(FULL)
    row = JobRecord(
        id=1,
        name="train-resnet",
        policy="resnet50-training",
        spec=stored_form(spec),
        state="succeeded",
        reason=None,
        restarts=0,
        created_at=T0,
        updated_at=T0,
    )
    assert job_spec(row) == spec
