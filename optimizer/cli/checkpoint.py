"""`gpuopt checkpoint commit DIR [--step N]`: commit a checkpoint folder (docs/checkpoints.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from optimizer.cli.common import fail

app = typer.Typer(
    help="Checkpoints that follow the job to its next instance.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command("commit")
def commit(
    folder: Path = typer.Argument(..., help="The checkpoint folder, written in full."),
    step: int | None = typer.Option(None, "--step", min=0, help="The training step it holds."),
) -> None:
    """Mark FOLDER as a complete checkpoint, so the agent uploads it.

    Its files are synced to disk, then the marker `.gpuopt-committed` is written (last,
    atomically), with the step when given."""
    from optimizer.checkpoints import CheckpointError
    from optimizer.checkpoints import commit as commit_folder

    try:
        marker = commit_folder(folder, step)
    except (CheckpointError, OSError) as exc:
        fail(exc)
    print(f"committed {marker.parent}" + (f" (step {step})" if step is not None else ""))
