"""`gpuopt config check|show`: validate the daemon config, or print it with secrets masked."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from optimizer.cli.common import fail

app = typer.Typer(
    help="Check or show the daemon configuration (YAML file plus GPUOPT_* variables).",
    no_args_is_help=True,
)

FileArg = Annotated[
    Path | None,
    typer.Argument(
        help="Config file (default: $GPUOPT_CONFIG, else gpuopt.yaml in the data directory).",
        dir_okay=False,
    ),
]


@app.command("check")
def check(file: FileArg = None) -> None:
    """Validate the config; every problem at once, each as file:line:col: field: message (or
    VARIABLE: field: message), in file order (exit 2)."""
    from optimizer.daemon.config import check_config, default_config_path

    problems = check_config(file)
    if problems:
        fail(*problems, prefixed=False)
    source = file if file is not None else default_config_path()
    print(f"{source or 'defaults and environment'}: ok")


@app.command("show")
def show(file: FileArg = None) -> None:
    """Print the effective config as YAML; secrets show as **********."""
    import yaml

    from optimizer.daemon.config import ConfigError, load_config

    try:
        config = load_config(file)
    except ConfigError as exc:
        fail(*exc.problems, prefixed=False)
    data = config.model_dump(mode="json")
    data["effective"] = {
        "data_dir": str(config.effective_data_dir),
        "policy_dir": str(config.effective_policy_dir),
        "database": "set (hidden)" if config.database_url else "sqlite in the data directory",
    }
    yaml.safe_dump(data, sys.stdout, sort_keys=False)
