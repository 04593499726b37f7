"""`gpuopt standby wait [--timeout S]`: a shell job's wait for the go (docs/standby.md)."""

from __future__ import annotations

import typer

from optimizer.cli.common import fail

app = typer.Typer(
    help="Standby start: a job started early waits for the agent's go.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command("wait")
def wait(
    timeout: float | None = typer.Option(
        None, "--timeout", help="Give up after this many seconds (exit 124)."
    ),
) -> None:
    """Wait for the agent's go, then exit 0; at once outside standby (GPUOPT_STANDBY unset).
    Exit 143 when the attempt was stopped before the go: the job must end without loading
    anything. The same as `python -m optimizer.standby`, which needs nothing but Python."""
    from optimizer.standby import wait_exit

    if timeout is not None and not timeout > 0:
        fail(f"--timeout must be above 0, not {timeout:g}")
    code = wait_exit(timeout)
    if code:
        raise typer.Exit(code)
