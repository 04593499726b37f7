"""`gpuopt progress STEP [--total N]`: report a job's progress (docs/progress.md)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from optimizer.cli.common import fail


def progress(
    step: int = typer.Argument(..., help="The steps done so far (0 or more)."),
    total: int | None = typer.Option(None, "--total", help="The steps of the whole run."),
    file: Path | None = typer.Option(
        None, "--file", help="Append here instead of to $GPUOPT_PROGRESS_FILE."
    ),
) -> None:
    """Append a progress report for the job's agent to forward: one JSON line
    {"step": STEP, "total": N} to $GPUOPT_PROGRESS_FILE. Outside gpuopt (the variable unset)
    it does nothing and says so on stderr; a file it cannot write is said on stderr too, and
    the exit is 0 either way: reporting progress never stops a job."""
    from optimizer.progress import ENV, ProgressLineError, line

    try:
        text = line(step, total)
    except ProgressLineError as exc:
        fail(exc)
    target = file or (Path(os.environ[ENV]) if os.environ.get(ENV) else None)
    if target is None:
        typer.echo(f"gpuopt progress: {ENV} is not set (not run by gpuopt): not reported", err=True)
        return
    try:
        with target.open("a", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        typer.echo(f"gpuopt progress: {target}: {exc.strerror or exc}: not reported", err=True)
