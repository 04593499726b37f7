"""The example training job survives two SIGTERMs and ends at exactly the planned step count."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from optimizer.progress import parse_line

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_with_checkpoints.py"
TOTAL = 60
ARGS = [sys.executable, str(SCRIPT)]

NEEDS_TORCH = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
ENGINES = [pytest.param("torch", marks=NEEDS_TORCH), "numpy"]


class Run:
    """The example as a child process, its output collected line by line on a thread."""

    def __init__(self, ckpt: Path, attempt: int, engine: str = "torch") -> None:
        env = {
            **os.environ,
            "GPUOPT_CHECKPOINT_DIR": str(ckpt),
            "GPUOPT_ATTEMPT": str(attempt),
            "GPUOPT_RESTARTS": str(attempt - 1),
            "GPUOPT_PROGRESS_FILE": str(ckpt.parent / "progress.jsonl"),
            "LOG_EVERY": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.proc = subprocess.Popen(
            [
                *ARGS,
                *("--engine", engine, "--steps", str(TOTAL), "--checkpoint-every", "10"),
                *("--step-sleep", "0.02"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.step = 0
        self._seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                found = re.match(r"step (\d+)/", line)
                if found:
                    self.step = int(found.group(1))
                self._seen.notify_all()

    def wait_for_step(self, step: int, timeout: float = 30) -> None:
        with self._seen:
            ok = self._seen.wait_for(lambda: self.step >= step, timeout)
        assert ok, "\n".join(self.lines)

    def finish(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def steps_printed(self) -> list[int]:
        return [int(m.group(1)) for line in self.lines if (m := re.match(r"step (\d+)/", line))]


@pytest.mark.parametrize("engine", ENGINES)
def test_two_interruptions_resume_from_checkpoints_and_end_at_the_planned_total(
    tmp_path: Path, engine: str
) -> None:
    ckpt = tmp_path / "ckpt"
    printed: list[int] = []
    stopped_at = []
    for attempt, interrupt_after in ((1, 15), (2, 35)):
        run = Run(ckpt, attempt, engine)
        run.wait_for_step(interrupt_after)
        run.proc.send_signal(signal.SIGTERM)
        assert run.finish() == 143
        out = "\n".join(run.lines)
        stopped = int(re.search(r"stopped at step (\d+)/", out).group(1))  # type: ignore[union-attr]
        assert stopped >= interrupt_after
        stopped_at.append(stopped)
        printed += run.steps_printed()
        if attempt == 2:
            assert f"resumed from step {stopped_at[0]}" in out

    last = Run(ckpt, 3, engine)
    assert last.finish() == 0, "\n".join(last.lines)
    out = "\n".join(last.lines)
    assert f"resumed from step {stopped_at[1]}" in out
    assert f"finished: {TOTAL}/{TOTAL} steps over 3 run(s)" in out
    printed += last.steps_printed()
    # Every step ran exactly once: a SIGTERM checkpoint loses no work.
    assert printed == list(range(1, TOTAL + 1))

    folders = sorted(ckpt.glob("step-*"))
    assert len(folders) <= 2  # old ones pruned
    assert all((f / ".gpuopt-committed").is_file() for f in folders)  # each one committed
    assert not list(ckpt.glob("step-*/.*.tmp"))  # no debris
    assert folders[-1].name == f"step-{TOTAL:08d}"
    marker = json.loads((folders[-1] / ".gpuopt-committed").read_text())
    assert marker == {"step": TOTAL}
    done = json.loads((ckpt / "done.json").read_text())
    assert json.loads((folders[-1] / "done.json").read_text()) == done  # it travels with it
    assert done["steps"] == TOTAL
    runs = done["runs"]
    assert [r["attempt"] for r in runs] == ["1", "2", "3"]
    assert [(r["from_step"], r["to_step"]) for r in runs] == [
        (0, stopped_at[0]),
        (stopped_at[0], stopped_at[1]),
        (stopped_at[1], TOTAL),
    ]
    # Its progress, by gpuopt's convention: every 10 steps of every run, the total with it.
    reports = [parse_line(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert {r.total for r in reports} == {TOTAL}
    assert sorted({r.step for r in reports}) == list(range(10, TOTAL + 1, 10))
    assert reports[-1].step == TOTAL
    # The same batches and the same state: three runs train exactly what one would have.
    alone = Run(tmp_path / "alone", 1, engine)
    assert alone.finish() == 0, "\n".join(alone.lines)
    losses = {json.loads((f / "done.json").read_text())["loss"] for f in (ckpt, tmp_path / "alone")}
    assert len(losses) == 1 and losses.pop() < 1


def test_the_example_job_spec_and_its_policy_are_well_formed() -> None:
    import yaml

    from optimizer.jobs.spec import load_job_spec
    from optimizer.storage import parse_uri
    from policies.loader import load_policy

    examples = SCRIPT.parent
    policy = load_policy(examples / "local-train-policy.yaml")
    job = yaml.safe_load((examples / "train-job.yaml").read_text())
    assert job["policy"] == policy.name and policy.placement.providers == ["local"]
    fields = {"name", "policy", "run", "setup", "checkpoint", "env", "probes", "max_restarts"}
    assert fields <= set(job) and job["probes"] in ("quick", "deep", "none")
    # Its checkpoints go to a bucket (here a local one), as on a real cloud, no shared folder.
    assert "checkpoint_dir" not in job
    bucket = parse_uri(job["checkpoint"])
    assert (bucket.scheme, bucket.prefix) == ("file", "/tmp/gpuopt-example/bucket")
    spec = load_job_spec(examples / "train-job.yaml")  # what `gpuopt jobs submit` reads
    assert spec.checkpoint is not None and spec.checkpoint_dir is None
    assert spec.checkpoint.uri == "file:///tmp/gpuopt-example/bucket"
    # The spec ships its own folder as code (docs/code.md), and runs the script from it.
    assert job["workdir"] == "." and "python train_with_checkpoints.py" in job["run"]
    assert (examples / job["workdir"] / "train_with_checkpoints.py").is_file()


def test_an_unknown_engine_in_the_environment_is_refused_by_name(tmp_path: Path) -> None:
    done = subprocess.run(
        [*ARGS, "--steps", "1", "--checkpoint-dir", str(tmp_path)],
        env={**os.environ, "TRAIN_ENGINE": "bogus"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "TRAIN_ENGINE: 'bogus' is not auto, torch or numpy" in done.stderr
    assert not list(tmp_path.iterdir())  # nothing trained, nothing written
