"""`python -m optimizer.agent`: what a new instance's bootstrap runs (and `gpuopt agent run`).

The bootstrap starts the agent through this module rather than the `gpuopt` command line, so
an instance's agent loads neither typer nor the other commands' modules before it registers:
every import here is on the path from a spot notice to the replacement's job.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

BAD_SETTINGS = 2  # as the command line's bad input (optimizer.cli.common.BAD_INPUT)


def run_agent() -> int:
    """Read the settings from the environment, log to the agent's folder, run the agent;
    its exit status (2, with one `gpuopt: error:` line, for settings it cannot use)."""
    from optimizer.agent.agent import Agent
    from optimizer.agent.config import AgentConfig, AgentConfigError
    from optimizer.common.files import private_dir

    try:
        config = AgentConfig.from_env()
    except AgentConfigError as exc:
        print(f"gpuopt: error: {exc}", file=sys.stderr)
        return BAD_SETTINGS
    private_dir(config.agent_dir)
    configure_logging(config.agent_dir / "agent.log")
    return Agent(config).run()


def configure_logging(path: Path) -> None:
    """Log to stderr and to `path` (created 0600), at INFO."""
    from optimizer.common.files import append_private

    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    with contextlib.suppress(OSError):
        append_private(path).close()  # created 0600: the handler appends to it
        handlers.append(logging.FileHandler(str(path), encoding="utf-8"))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    # httpx logs every request at INFO; the agent says what matters itself.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
