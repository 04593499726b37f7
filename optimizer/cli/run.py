"""`gpuopt run`: a job in one line, its resources written inline (docs/cli.md, "gpuopt run").

    gpuopt run --gpu T4 --spot --max-price 0.5 --region 'eu-*' -- python train.py

The flags make a job spec with a `resources:` block (policies/inline.py), which the daemon
writes over its default policy, or over `--policy NAME`; then it is submitted as `gpuopt jobs
submit` submits a file: the plan first, "Launch? [Y/n]" on a terminal (optimizer/cli/plan.py).
A bad value is an error naming its flag.
"""

from __future__ import annotations

import re
import secrets
import shlex
from pathlib import Path, PurePath
from typing import Annotated, Any

import typer

from optimizer.cli.client import ApiOption
from optimizer.cli.common import fail

# Which flag sets each field of the spec (for errors located at the flag).
FLAGS = {
    "resources.gpu": "--gpu",
    "resources.gpus": "--gpus",
    "resources.market": "--spot/--on-demand",
    "resources.max_price": "--max-price",
    "resources.regions": "--region",
    "resources.compliance": "--compliance",
    "resources.providers": "--provider",
    "name": "--name",
    "policy": "--policy",
    "workdir": "--workdir",
    "checkpoint_dir": "--checkpoint-dir",
    "setup": "--setup",
    "env": "--env",
    "run": "COMMAND",
}


def default_name(command: list[str]) -> str:
    """`train-3f2a` for `python train.py`: the script's (else the program's) name, made a
    job name, and four random hex digits so that runs of the same command do not collide."""
    script = next((w for w in command if re.search(r"\.(py|sh)$", w)), command[0])
    stem = re.sub(r"[^a-z0-9]+", "-", PurePath(script).stem.lower()).strip("-")[:40] or "run"
    return f"{stem.strip('-') or 'run'}-{secrets.token_hex(2)}"


def _env(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            fail(f"--env {pair!r}: write NAME=VALUE")
        out[key] = value
    return out


def run(
    command: Annotated[
        list[str],
        typer.Argument(help="The command to run, after `--` (python train.py --epochs 3)."),
    ],
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU model (T4, A100-80GB; aliases too).")
    ] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs per node.")] = None,
    spot: Annotated[
        bool | None,
        typer.Option(
            "--spot/--on-demand",
            help="Spot only, or on-demand only (default: both).",
            show_default=False,
        ),
    ] = None,
    max_price: Annotated[
        float | None, typer.Option("--max-price", help="USD per hour for the whole instance.")
    ] = None,
    region: Annotated[
        list[str] | None,
        typer.Option("--region", metavar="GLOB", help="Region glob ('eu-*'); repeatable."),
    ] = None,
    compliance: Annotated[
        str | None, typer.Option("--compliance", help="Region preset: eu (alias gdpr), us, uk, ch.")
    ] = None,
    provider: Annotated[
        list[str] | None,
        typer.Option("--provider", metavar="NAME", help="Provider (aws, gcp, local); repeatable."),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="Write the resources over this loaded policy "
            "(default: the daemon's default policy).",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="The job's name (default: the script's, made unique)."),
    ] = None,
    workdir: Annotated[
        str | None,
        typer.Option(
            "--workdir",
            help="Where the command runs; a folder here is packed and "
            "shipped with the job (docs/code.md).",
        ),
    ] = None,
    setup: Annotated[str | None, typer.Option("--setup", help="Runs before the command.")] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", metavar="NAME=VALUE", help="NAME=VALUE for the job; repeatable."),
    ] = None,
    checkpoint_dir: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-dir",
            help="A folder the attempts share (without one, an "
            "interrupted job restarts from the beginning).",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Submit without asking.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and stop: nothing is submitted.")
    ] = False,
    api: ApiOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the API's JSON.")] = False,
) -> None:
    """Run a command on a GPU in one line: the resources are flags, written over the
    daemon's default policy (docs/cli.md, "gpuopt run"). Prints the plan and asks "Launch?"
    on a terminal."""
    from pydantic import ValidationError

    from optimizer.cli.jobs import check_name, print_job_answer
    from optimizer.cli.plan import located, submit_planned
    from optimizer.jobs.spec import JobSpec

    if not command:
        fail("give the command to run after `--` (gpuopt run --gpu T4 -- python train.py)")
    if name is not None:
        check_name(name)
    resources: dict[str, Any] = {
        "gpu": gpu,
        "gpus": gpus,
        "market": None if spot is None else ("spot" if spot else "on_demand"),
        "max_price": max_price,
        "regions": region or None,
        "compliance": compliance,
        "providers": provider or None,
    }
    data: dict[str, Any] = {
        "name": name or default_name(command),
        "policy": policy,
        "resources": {k: v for k, v in resources.items() if v is not None},
        "run": shlex.join(command),
        "setup": setup,
        "workdir": workdir,
        "checkpoint_dir": checkpoint_dir,
        "env": _env(env or []),
    }
    try:
        spec = JobSpec.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as exc:
        fail(*located(exc, FLAGS))
    submit_planned(
        spec,
        Path("gpuopt-run"),  # relative paths (--workdir) are the current folder's
        None,
        api,
        yes=yes,
        dry_run=dry_run,
        as_json=as_json,
        show_job=print_job_answer,
    )
