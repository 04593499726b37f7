"""`gpuopt local ...`: look at and poke the local cloud (instances, interruptions, faults).

These commands act on the local cloud's state directory (`<data dir>/local-cloud` unless
`--state-dir` says otherwise), which the daemon's local cloud reads: an interruption written
here shows on the instance's metadata endpoint at once, and the daemon's local cloud powers
the instance off when its grace period ends.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from optimizer.cli.common import fail

app = typer.Typer(
    help="The local cloud: list instances, inject interruptions and launch failures.",
    no_args_is_help=True,
    add_completion=False,
)

StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="The local cloud's state directory (default: <GPUOPT_DATA_DIR>/local-cloud).",
        file_okay=False,
    ),
]


def default_state_dir() -> Path:
    from optimizer.daemon.settings import data_dir

    return data_dir() / "local-cloud"


def _cloud(state_dir: Path | None):  # -> LocalCloud, imported lazily
    from providers.local import LocalCloud

    return LocalCloud(state_dir or default_state_dir())


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@app.command("list")
def list_instances(
    state_dir: StateDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    all_: Annotated[bool, typer.Option("--all", help="Include ended instances.")] = False,
) -> None:
    """List the local cloud's instances (running ones unless --all)."""
    records = [r for r in _cloud(state_dir).instances() if all_ or not r.ended]
    if as_json:
        json.dump([r.to_json() for r in records], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if not records:
        print("no instances" if all_ else "no running instances (--all shows ended ones)")
        return
    header = f"{'INSTANCE':<15} {'STATE':<20} {'TYPE':<20} {'ZONE':<18} {'MARKET':<9} {'$/h':>9}  "
    print(header + "JOB / DETAIL")
    for r in records:
        detail = r.detail
        if r.interruption is not None and not r.ended:
            detail = f"interrupted: power-off at {_when(r.interruption.kill_at)}"
        job = f"{r.job} #{r.attempt}" if r.job else r.key
        price = f"{r.usd_per_hour:.4f}" + (" sim" if r.market == "spot" else "")
        state = f"{r.state} ({r.end_reason})" if r.ended and r.end_reason else r.state
        print(
            f"{r.id:<15} {state:<20} {r.instance_type:<20} {r.zone:<18} {r.market:<9} "
            f"{price:>9}  {job}{'  ' + detail if detail else ''}"
        )


@app.command("interrupt")
def interrupt(
    instance: Annotated[str, typer.Argument(help="Instance id, e.g. i-local-0001.")],
    state_dir: StateDirOption = None,
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            min=0,
            help="Seconds from the notice to power-off (default: the running cloud's, 30).",
        ),
    ] = None,
    action: Annotated[
        str, typer.Option("--action", help="The notice's action: terminate, stop, hibernate.")
    ] = "terminate",
) -> None:
    """Interrupt a spot instance: post the notice now, power it off after the grace period."""
    if action not in ("terminate", "stop", "hibernate"):
        fail(f"--action must be terminate, stop or hibernate, not {action!r}")
    cloud = _cloud(state_dir)
    try:
        record = cloud.interrupt(instance, grace_s=grace, action=action)
    except (KeyError, ValueError) as exc:
        fail(exc.args[0] if exc.args else exc)
    assert record.interruption is not None
    print(
        f"{instance}: interruption notice posted ({record.interruption.action}); "
        f"power-off at {_when(record.interruption.kill_at)}"
    )


@app.command("fail-next")
def fail_next(
    match: Annotated[
        str, typer.Argument(help="Instance type, region or zone the fault applies to; * = any.")
    ],
    state_dir: StateDirOption = None,
    error: Annotated[
        str,
        typer.Option(
            "--error", help="capacity, quota, price, throttled, auth or provider (the type)."
        ),
    ] = "capacity",
    times: Annotated[int, typer.Option("--times", min=1, help="How many launches fail.")] = 1,
) -> None:
    """Make the next launches on matching offers fail with a typed cloud error."""
    from providers.local import FAULTS

    if error not in FAULTS:
        fail(f"--error must be one of {', '.join(FAULTS)}, not {error!r}")
    _cloud(state_dir).fail_next(match, error, times=times)
    print(f"the next {times} launch(es) matching {match!r} will fail with a {error} error")
