"""`gpuopt machines`: the team's own GPU machines, reached over SSH (docs/owned.md), through
the daemon's API (`/machines`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from optimizer.cli.client import ApiOption, call, read
from optimizer.cli.common import fail
from optimizer.cli.render import (
    Column,
    OutputOption,
    WideOption,
    render_lines,
    target_width,
    wants_wide,
)

app = typer.Typer(
    help="Owned GPU machines reached over SSH: add, list, drain (through the daemon's API).",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]
_DESTINATION = re.compile(r"^(?P<user>[^@\s]+)@(?P<host>[^@\s:]+)$")

COLUMNS = [
    Column("NAME", key=True),
    Column("STATE", key=True),
    Column("GPUS", key=True),
    Column("FREE", right=True, key=True),
    Column("$/GPU-H", right=True, key=True),
    Column("REGION", drop=2),
    Column("SITE", drop=3),
    Column("HOST", drop=4),
    Column("CHECK", cut=True, drop=1),
]


def lines(machines: list[dict[str, Any]], *, width: int | None = None) -> list[str]:
    if not machines:
        return ["no owned machines (add one: gpuopt machines add USER@HOST ...)"]
    rows = []
    for m in machines:
        rate = m.get("usd_per_gpu_hour")
        state = m["state"] + (f" until {m['draining_until']}" if m.get("draining_until") else "")
        rows.append(
            [
                m["name"],
                state,
                f"{m['gpus']}x {m['gpu_model']}" + (" (simulated)" if m.get("simulated") else ""),
                f"{m['gpus_free']}/{m['gpus']}",
                "-" if rate is None else f"{rate:.4f}",
                m["region"],
                m["site"],
                f"{m['user']}@{m['host']}:{m['port']}",
                m.get("check") or "-",
            ]
        )
    return render_lines(COLUMNS, rows, width=width)


@app.command("list")
def list_machines(
    api: ApiOption = None,
    as_json: JsonOption = False,
    output: OutputOption = None,
    wide: WideOption = False,
) -> None:
    """The owned machines: state, GPUs free of all, price per GPU-hour (TCO), last check."""
    from optimizer.answers import MachineList

    found = read(MachineList, call("GET", "/machines", api)).machines
    if as_json or output == "json":
        print(json.dumps(found, indent=2))
        return
    for line in lines(found, width=target_width(wide=wants_wide(output, wide))):
        print(line)


@app.command("add")
def add_machine(
    destination: Annotated[str, typer.Argument(help="USER@HOST")],
    region: Annotated[
        str, typer.Option(help="The cloud region nearest the machine (eu-central-1).")
    ],
    gpus: Annotated[int, typer.Option(help="GPUs the machine has.")],
    gpu_model: Annotated[str, typer.Option("--gpu-model", help="As the catalog names it (T4).")],
    name: Annotated[str | None, typer.Option(help="Its name (default: the host's).")] = None,
    port: Annotated[int, typer.Option(help="SSH port.")] = 22,
    key: Annotated[Path | None, typer.Option("--key", help="Private key file.")] = None,
    site: Annotated[str | None, typer.Option(help="Building or rack (default: region).")] = None,
    gpu_memory_gib: Annotated[float | None, typer.Option("--gpu-memory-gib")] = None,
    python: Annotated[
        str | None, typer.Option(help="The interpreter there that has gpuopt.")
    ] = None,
    capex_usd: Annotated[
        float | None, typer.Option("--capex-usd", help="What the machine cost (TCO).")
    ] = None,
    trust_new_host_key: Annotated[
        bool,
        typer.Option(
            "--trust-new-host-key",
            help="Pin the host key when this host is not in known_hosts yet (first use).",
        ),
    ] = False,
    api: ApiOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add a machine: checked at once (reached with its host key checked, its GPUs read by
    the agent's inventory and compared, its disk)."""
    found = _DESTINATION.match(destination)
    if found is None:
        fail(f"{destination!r}: expected USER@HOST")
    machine: dict[str, Any] = {
        "name": name or found["host"].split(".")[0].lower(),
        "host": found["host"],
        "user": found["user"],
        "port": port,
        "region": region,
        "gpus": gpus,
        "gpu_model": gpu_model,
    }
    if key is not None:
        machine["key_file"] = str(key.expanduser().resolve())
    for field, value in (("site", site), ("gpu_memory_gib", gpu_memory_gib), ("python", python)):
        if value is not None:
            machine[field] = value
    if capex_usd is not None:
        machine["tco"] = {"capex_usd": capex_usd}
    body = {"machine": machine, "trust_new_host_key": trust_new_host_key}
    view = call("POST", "/machines", api, json=body)
    if as_json:
        print(json.dumps(view, indent=2))
        return
    print(f"added {view['name']}: {view.get('check') or 'checked'}")


@app.command("check")
def check_machine(name: str, api: ApiOption = None) -> None:
    """Check a machine again now."""
    view = call("POST", f"/machines/{name}/check", api)
    print(f"{view['name']}: {view['state']}: {view.get('check') or '-'}")


@app.command("drain")
def drain_machine(
    name: str,
    in_: Annotated[
        str, typer.Option("--in", help="When it is taken: 10m, 90s, 2h or 1d (default 10m).")
    ] = "10m",
    api: ApiOption = None,
) -> None:
    """Take a machine back: no new work on it, and its jobs moved by the hot handover (to
    another owned machine, else the cloud) before it goes."""
    from optimizer.answers import MachineDrained
    from optimizer.cli.backtest import parse_duration

    seconds = parse_duration(in_, "--in")
    answer = read(
        MachineDrained, call("POST", f"/machines/{name}/drain", api, json={"in_s": seconds})
    )
    told = ", ".join(answer.told) or "nothing runs there"
    print(f"draining {name} until {answer.power_off_at}; told: {told}")


@app.command("undrain")
def undrain_machine(name: str, api: ApiOption = None) -> None:
    """Give a drained machine back to the offers."""
    view = call("POST", f"/machines/{name}/undrain", api)
    print(f"{view['name']}: {view['state']}, {view['gpus_free']}/{view['gpus']} GPUs free")


@app.command("remove")
def remove_machine(name: str, api: ApiOption = None) -> None:
    """Forget a machine added with `machines add` (refused while jobs run there)."""
    call("DELETE", f"/machines/{name}", api)
    print(f"removed {name}")
