"""`gpuopt daemon`: the long-running service (imports the daemon only when it runs)."""

from __future__ import annotations

import logging
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from optimizer.cli.common import fail


class LogFormat(StrEnum):
    text = "text"
    json = "json"


def daemon(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Config file (default: $GPUOPT_CONFIG, else gpuopt.yaml in the data directory).",
            dir_okay=False,
        ),
    ] = None,
    log_format: Annotated[
        LogFormat | None, typer.Option("--log-format", help="text or json (one object a line).")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Listen address (api.host).")] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", min=0, max=65535, help="Listen port (api.port); 0 = any free."),
    ] = None,
) -> None:
    """Run the daemon: poll prices, reload policies, send alerts, serve the HTTP API."""
    from optimizer.daemon.config import ConfigError, load_config
    from optimizer.daemon.connections import raise_open_file_limit
    from optimizer.daemon.logsetup import configure
    from optimizer.daemon.providers import provider_secrets
    from optimizer.daemon.server import BindError
    from optimizer.daemon.service import Daemon, DaemonError
    from optimizer.store import DatabaseUrlError, is_sqlite_url
    from optimizer.ui import console_app

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        fail(*exc.problems)
    api = cfg.api.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    log = cfg.log.model_copy(update={"format": log_format.value} if log_format else {})
    cfg = cfg.model_copy(update={"api": api, "log": log})
    secrets = [*cfg.secrets(), *provider_secrets()]
    configure(log.format, log.level, secrets=secrets, access_log=api.access_log)
    raise_open_file_limit()

    try:
        service = Daemon(cfg, face=console_app)
    except (BindError, DaemonError, DatabaseUrlError) as exc:
        fail(exc)

    def announce(url: str) -> None:
        token = f"token in {service.token_file}" if service.token_file else "token from api.token"
        print(f"gpuopt: API at {url} (docs: {url}/docs; console: {url}/ui/; {token})", flush=True)
        print(f"gpuopt: policies from {cfg.effective_policy_dir}", flush=True)
        url_text = cfg.effective_database_url
        store = url_text.partition(":///")[2] if is_sqlite_url(url_text) else "PostgreSQL"
        print(
            f"gpuopt: store {store}; providers: {', '.join(service.handles) or 'none'}",
            flush=True,
        )

    try:
        code = service.run(announce)
    except (BindError, DaemonError) as exc:
        fail(exc)
    exit_at_once(code)


def exit_at_once(code: int) -> NoReturn:
    """End the process now that the daemon has stopped: flush the logs and the output, then
    `os._exit`. `Daemon.stop()` has closed everything it opened (loops, API, providers, the
    store), so the interpreter's own teardown would only free memory, and that is what held
    a stopped daemon: collecting and freeing its ~150,000 objects and ~1,200 modules took
    0.5 to 2 s of CPU after the "stopped" line (bench/stop.py)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
