"""`gpuopt agent run`: the agent on a managed instance (started by its bootstrap script)."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="The agent that runs on each managed instance.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command("run")
def run() -> None:
    """Register with the daemon, probe, run the job and report until it ends.

    Configured by the environment the bootstrap script sets: GPUOPT_DAEMON_URL,
    GPUOPT_AGENT_TOKEN, GPUOPT_ATTEMPT_KEY, GPUOPT_CLOUD (the provider),
    GPUOPT_METADATA_KIND (aws-imds|gcp-metadata), GPUOPT_METADATA_URL and GPUOPT_AGENT_DIR
    (see docs/agent-protocol.md). The same as `python -m optimizer.agent`, which the
    bootstrap runs.
    """
    from optimizer.agent import run_agent

    raise typer.Exit(run_agent())
