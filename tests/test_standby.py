"""Standby start's pieces (docs/standby.md): the job's helper (optimizer/standby.py) against
real waiting processes, the spec field and the protocol's `standby`, and the example job
waiting for its go before it loads its checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer import protocol, standby
from optimizer.jobs.spec import JobSpecError, from_stored, parse_job_spec, stored_form
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_with_checkpoints.py"

# Says it is ready, waits for the go, then says what it got.
WAITER = """
import sys
from pathlib import Path
from optimizer.standby import Stopped, wait_for_go
Path(sys.argv[1]).write_text("ready")
try:
    print("waited" if wait_for_go() else "not in standby", flush=True)
except Stopped:
    print("stopped", flush=True)
    raise
"""


def waiter(tmp_path: Path, name: str, go: Path | None) -> tuple[subprocess.Popen[str], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    if go is not None:
        env.update(GPUOPT_STANDBY="1", GPUOPT_GO_FILE=str(go))
    ready = tmp_path / f"{name}.ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, str(ready)],
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, ready


def test_outside_standby_the_helper_returns_at_once(tmp_path: Path) -> None:
    proc, _ = waiter(tmp_path, "plain", None)
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out.strip()) == (0, "not in standby")


def test_the_go_releases_every_waiter_and_one_that_looks_late(tmp_path: Path) -> None:
    go = tmp_path / "go"
    standby.prepare(go)
    assert not go.is_file() and standby.given(go) is None  # a pipe: no go yet
    waiters = [waiter(tmp_path, f"w{i}", go) for i in range(3)]
    for _, ready in waiters:
        wait_until(ready.exists, 30, "a waiter to be ready")
    assert all(proc.poll() is None for proc, _ in waiters)  # each one waits
    standby.give(go)
    for proc, _ in waiters:
        out, _ = proc.communicate(timeout=30)
        assert (proc.returncode, out.strip()) == (0, "waited")
    assert standby.given(go) == "go" and go.is_file()
    late, _ = waiter(tmp_path, "late", go)
    assert late.communicate(timeout=60)[0].strip() == "waited"


def test_a_stop_before_the_go_ends_the_waiter_with_143(tmp_path: Path) -> None:
    go = tmp_path / "go"
    standby.prepare(go)
    proc, ready = waiter(tmp_path, "w", go)
    wait_until(ready.exists, 30, "the waiter to be ready")
    standby.give(go, standby.STOP)
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out.strip()) == (143, "stopped")


def test_a_shell_job_waits_with_the_module_or_cat(tmp_path: Path) -> None:
    go = tmp_path / "go"
    standby.prepare(go)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUOPT_STANDBY": "1"}
    env["GPUOPT_GO_FILE"] = str(go)
    module = subprocess.Popen([sys.executable, "-m", "optimizer.standby"], env=env)
    shell = subprocess.Popen(
        ["/bin/sh", "-c", f'cat "{go}" >/dev/null; cat "{go}"'], stdout=subprocess.PIPE, text=True
    )
    standby.give(go)
    assert module.wait(timeout=30) == 0
    assert shell.communicate(timeout=30)[0].strip() == "go"


def test_the_module_says_a_timeout_and_a_stop_by_its_exit_status(tmp_path: Path) -> None:
    go = tmp_path / "go"
    standby.prepare(go)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUOPT_STANDBY": "1"}
    env["GPUOPT_GO_FILE"] = str(go)
    argv = [sys.executable, "-m", "optimizer.standby", "--timeout", "0.2"]
    timed_out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert timed_out.returncode == 124 and "no go within 0.2 s" in timed_out.stderr
    standby.give(go, standby.STOP)
    stopped = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 143 and "stopped before the go" in stopped.stderr
    bad = subprocess.run([*argv[:3], "--wait"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "usage:" in bad.stderr


def test_the_helper_loads_no_dependency() -> None:
    code = (
        "import sys; import optimizer.standby; "
        "print(sorted(m for m in ('pydantic', 'torch', 'sqlalchemy', 'httpx', 'numpy') "
        "if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


SPEC = """\
name: train
policy: p
run: python train.py
checkpoint: s3://team-ckpt/train
"""


def test_the_spec_field_defaults_to_off_and_travels_to_the_agent() -> None:
    assert parse_job_spec(SPEC).standby is False
    spec = parse_job_spec(SPEC + "standby: true\n")
    assert spec.standby is True
    assert from_stored(stored_form(spec), name="train", policy="p").standby is True
    # Older stored specs have no key: off.
    older = from_stored({"run": "x", "checkpoint": "s3://team-ckpt/x"}, name="t", policy="p")
    assert older.standby is False


def test_a_bad_standby_value_is_a_located_error() -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(SPEC + "standby: sometimes\n", path="train.yaml")
    text = str(caught.value)
    assert text.startswith("train.yaml:5:") and "standby" in text


def test_a_job_spec_may_not_set_the_standby_variables() -> None:
    with pytest.raises(JobSpecError, match="GPUOPT_GO_FILE is set by gpuopt"):
        parse_job_spec(SPEC + "env: {GPUOPT_GO_FILE: /tmp/x}\n")


def test_the_protocol_sends_standby_only_when_on() -> None:
    plain = protocol.Job(run="x")
    assert plain.standby is False and "standby" not in plain.wire()
    on = protocol.Job.model_validate({"run": "x", "standby": True})
    assert on.wire()["standby"] is True
    # An older daemon's answer has no key; a newer one's unknown keys are ignored.
    assert protocol.RegisterAnswer.model_validate({"job": {"run": "x"}}).job.standby is False
    with pytest.raises(ValueError, match="standby"):
        protocol.Job.model_validate({"run": "x", "standby": "yes"})
    assert (protocol.ENV_STANDBY, protocol.ENV_GO_FILE) == ("GPUOPT_STANDBY", "GPUOPT_GO_FILE")


def example(ckpt: Path, steps: int, **env: str) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--engine", "numpy", "--steps", str(steps)],
        env={**base, "PYTHONPATH": str(ROOT), "GPUOPT_CHECKPOINT_DIR": str(ckpt), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_example_waits_in_standby_and_loads_the_checkpoint_after_the_go(
    tmp_path: Path,
) -> None:
    ckpt, go, steps = tmp_path / "ckpt", tmp_path / "go", tmp_path / "steps.jsonl"
    standby.prepare(go)
    proc = example(
        ckpt,
        30,
        GPUOPT_STANDBY="1",
        GPUOPT_GO_FILE=str(go),
        CHECKPOINT_EVERY="10",
        STEP_LOG=str(steps),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "standby: model built, waiting for the go"
    # The checkpoint arrives while it waits (the agent's restore): it must be the one loaded.
    first = example(ckpt, 20, CHECKPOINT_EVERY="10")
    assert first.wait(timeout=120) == 0
    assert proc.poll() is None and not steps.exists()
    standby.give(go)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    assert "standby: go given" in out and "resumed from step 20" in out
    assert "finished: 30/30 steps over 2 run(s)" in out
    logged = [json.loads(line) for line in steps.read_text().splitlines()]
    assert [line["step"] for line in logged] == list(range(21, 31))
    assert all(isinstance(line["t"], float) for line in logged)


def test_the_example_stopped_in_standby_exits_143_having_trained_nothing(tmp_path: Path) -> None:
    go = tmp_path / "go"
    standby.prepare(go)
    proc = example(tmp_path / "ckpt", 30, GPUOPT_STANDBY="1", GPUOPT_GO_FILE=str(go))
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("standby: model built")
    standby.give(go, standby.STOP)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 143 and "step" not in out
    assert not list((tmp_path / "ckpt").glob("step-*"))


def test_gpuopt_standby_wait_exits_0_on_the_go_and_143_on_a_stop(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "optimizer.cli", "standby", "wait"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    base["PYTHONPATH"] = str(ROOT)
    assert subprocess.run(argv, env=base, timeout=60).returncode == 0  # not in standby
    for word, status in ((standby.GO, 0), (standby.STOP, 143)):
        go = tmp_path / f"go-{word}"
        standby.prepare(go)
        env = {**base, "GPUOPT_STANDBY": "1", "GPUOPT_GO_FILE": str(go)}
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        standby.give(go, word)
        assert proc.wait(timeout=60) == status
