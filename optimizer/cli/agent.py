"""`gpuopt agent run`: the agent on a managed instance (started by its bootstrap script)."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

import typer

from optimizer.cli.common import fail
from optimizer.common.files import append_private, private_dir

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
    (see docs/agent-protocol.md).
    """
    from optimizer.agent import Agent, AgentConfig, AgentConfigError

    try:
        config = AgentConfig.from_env()
    except AgentConfigError as exc:
        fail(exc)
    private_dir(config.agent_dir)
    _configure_logging(config.agent_dir / "agent.log")
    raise typer.Exit(Agent(config).run())


def _configure_logging(path: object) -> None:
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    with contextlib.suppress(OSError):
        append_private(Path(str(path))).close()  # created 0600: the handler appends to it
        handlers.append(logging.FileHandler(str(path), encoding="utf-8"))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    # httpx logs every request at INFO; the agent says what matters itself.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
