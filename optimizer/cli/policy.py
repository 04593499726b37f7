"""`gpuopt policy …`: check policy files and print their JSON Schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from optimizer.cli.common import fail

app = typer.Typer(
    help="Check policy files, add them to the daemon, print the policy JSON Schema.",
    no_args_is_help=True,
)


@app.command("check")
def check(
    files: Annotated[list[Path], typer.Argument(help="Policy YAML files.", show_default=False)],
) -> None:
    """Validate policy files; print every problem as file:line:col: field: message.

    Exit 0 when every file is valid, 2 otherwise.
    """
    from policies.loader import PolicyError, load_policy

    names: dict[str, str] = {}
    failed = 0
    for path in files:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            failed += 1
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            continue
        if policy.name in names:
            failed += 1
            other = names[policy.name]
            print(
                f"{path}: name: policy name {policy.name!r} is already used by {other}",
                file=sys.stderr,
            )
            continue
        names[policy.name] = str(path)
        need = policy.memory_need_gib()
        print(f"{path}: ok ({policy.name}: {policy.workload.gpus} GPU(s), {need:.1f} GiB per GPU)")
    if failed:
        fail(f"{failed} of {len(files)} policy file(s) invalid", prefixed=False)


@app.command("add")
def add(
    file: Annotated[Path, typer.Argument(help="Policy YAML file.", show_default=False)],
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="The daemon config whose policy folder to use.", dir_okay=False
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a different file of the same name.")
    ] = False,
) -> None:
    """Check a policy file and copy it into the daemon's policy folder (created when missing),
    as <name>.yaml: a running daemon loads it within seconds, a daemon started later at once."""
    import filecmp
    import shutil

    from optimizer.common.files import private_dir
    from optimizer.daemon.config import ConfigError, load_config
    from policies.loader import PolicyError, load_policy

    try:
        policy = load_policy(file)
    except PolicyError as exc:
        fail(*exc.problems)
    try:
        folder = load_config(config).effective_policy_dir
    except ConfigError as exc:
        fail(*exc.problems)
    target = folder / f"{policy.name}.yaml"
    if target.exists() and not filecmp.cmp(file, target, shallow=False) and not force:
        fail(f"{target} holds another version of policy {policy.name!r}; --force replaces it")
    for other in sorted(folder.glob("*.y*ml")) if folder.is_dir() else []:
        if other.name == target.name:
            continue
        try:
            named = load_policy(other).name
        except PolicyError:
            continue
        if named == policy.name:
            fail(f"{other} already defines policy {policy.name!r}; remove it or rename one")
    try:
        private_dir(folder)
        shutil.copyfile(file, target)
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror or exc}")
    print(f"policy {policy.name} in {target} (a running daemon loads it within seconds)")


@app.command("windows")
def windows(
    file: Annotated[Path, typer.Argument(help="Policy YAML file.", show_default=False)],
    days: Annotated[
        float, typer.Option("--days", min=0, help="How far ahead to list transitions.")
    ] = 7,
    start: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="List from this instant, ISO 8601 with a UTC offset, instead of now.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the window in force and the coming transitions of a policy's schedule, with
    what each changes (markets, bid, placement, rank_by)."""
    from datetime import UTC, datetime, timedelta

    from optimizer.cli.ranked import parse_at
    from policies.loader import PolicyError, load_policy
    from policies.schedule import window_plan

    try:
        policy = load_policy(file)
    except PolicyError as exc:
        fail(*exc.problems)
    since = datetime.now(UTC) if start is None else parse_at(start, option="--from")
    plan = window_plan(policy, since, since + timedelta(days=days))
    if as_json:
        sys.stdout.write(json.dumps(plan.to_dict(), indent=2) + "\n")
        return
    print(plan.text())


@app.command("schema")
def schema(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")
    ] = None,
) -> None:
    """Print the JSON Schema of policy files (editors validate with it)."""
    from policies.schema import json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            fail(f"--output {output}: {exc.strerror}")
