"""Subprocesses with hard timeouts: a probe that hangs is killed, never waited on forever."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How one subprocess ended: its JSON report, or why there is none."""

    report: dict[str, Any] | None
    seconds: float
    timed_out: bool = False
    error: str | None = None


def run_children(
    commands: Sequence[tuple[Sequence[str], Mapping[str, str]]], timeout_s: float
) -> list[ChildOutcome]:
    """Start every command at once (each gets `--out FILE` appended) and wait for all, killing
    any still running at `timeout_s`, together with its children (own process group)."""
    with tempfile.TemporaryDirectory(prefix="gpuopt-probe-") as tmp:
        procs = []
        began = time.monotonic()
        for i, (argv, env) in enumerate(commands):
            out = Path(tmp, f"child{i}.json")
            log = open(Path(tmp, f"child{i}.log"), "w+b")  # noqa: SIM115 - closed below
            proc = subprocess.Popen(
                [*argv, "--out", str(out)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                start_new_session=True,
            )
            procs.append((proc, out, log))
        outcomes = []
        deadline = began + timeout_s
        for proc, out, log in procs:
            timed_out = False
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            seconds = time.monotonic() - began
            log.seek(0)
            tail = log.read()[-2000:].decode("utf-8", "replace").strip()
            log.close()
            outcomes.append(_outcome(proc.returncode, out, tail, seconds, timed_out))
        return outcomes


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _outcome(rc: int | None, out: Path, tail: str, seconds: float, timed_out: bool) -> ChildOutcome:
    if timed_out:
        return ChildOutcome(None, seconds, timed_out=True, error="timed out")
    try:
        report = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        last = tail.splitlines()[-1] if tail else "no output"
        return ChildOutcome(None, seconds, error=f"exited with status {rc}: {last}")
    return ChildOutcome(report, seconds)
