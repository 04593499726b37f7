"""`gpuopt probes list`: the probe results agents reported, through the daemon's API
(`GET /probes`). `gpuopt probe` (singular) runs a probe on this machine."""

from __future__ import annotations

import json
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
    help="The GPU probe results agents reported (through the daemon's API).",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]
_PAGE = 1000  # the API's largest page


@app.command("list")
def list_probes(
    instance_type: Annotated[
        str | None, typer.Option("--instance-type", help="Only this instance type's results.")
    ] = None,
    provider: Annotated[str | None, typer.Option(help="Only this provider's results.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many results.")] = 50,
    api: ApiOption = None,
    as_json: JsonOption = False,
    output: OutputOption = None,
    wide: WideOption = False,
) -> None:
    """Probe results, newest first: verdict, measured TFLOPS and bandwidth per GPU."""
    as_json = as_json or output == "json"
    if limit < 1:
        fail(f"--limit: expected a positive number of results, got {limit}")
    from optimizer.answers import ProbeList

    found: list[dict[str, Any]] = []
    before: int | None = None
    while len(found) < limit:
        params: dict[str, Any] = {"limit": min(_PAGE, limit - len(found))}
        if instance_type is not None:
            params["instance_type"] = instance_type
        if provider is not None:
            params["provider"] = provider
        if before is not None:
            params["before"] = before
        page = read(ProbeList, call("GET", "/probes", api, params=params)).probes
        found.extend(page)
        if len(page) < params["limit"]:
            break
        before = page[-1]["id"]
    if as_json:
        print(json.dumps(found, indent=2))
        return
    for line in lines(found, width=target_width(wide=wants_wide(output, wide))):
        print(line)


def _figure(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:,.1f} {unit}"


_SOURCE_NOTE = {"host": "host GPU", "simulated": "simulated"}
_KIND_NOTE = {"handover": "handover"}

COLUMNS = [
    Column("AT", key=True),
    Column("PROVIDER", drop=2),
    Column("INSTANCE TYPE", key=True),
    Column("ZONE", drop=3),
    Column("STATUS", key=True),
    Column("BF16/GPU", right=True, drop=1),
    Column("COPY/GPU", right=True, drop=1),
    Column("JOB", key=True),
]


def _notes(p: dict[str, Any]) -> str:
    """` (host GPU)`, ` (simulated)`, ` (handover)`: where the figures come from, and a
    handover probe's (which has no TFLOPS of its own)."""
    # Older daemons send `simulated` alone.
    source = p.get("source") or ("simulated" if p["simulated"] else "measured")
    notes = [n for n in (_SOURCE_NOTE.get(source), _KIND_NOTE.get(str(p.get("kind")))) if n]
    return "".join(f" ({n})" for n in notes)


def lines(found: list[dict[str, Any]], *, width: int | None = None) -> list[str]:
    """The results as the terminal shows them, one line each under a header, fitted to
    `width` (None: every column)."""
    if not found:
        return ["no probe results"]
    rows = [
        [
            p["at"],
            p["provider"],
            p["instance_type"],
            p["zone"] or "-",
            p["status"],
            _figure(p["tflops"].get("bf16"), "TFLOPS"),
            _figure(p["copy_gbps"], "GB/s"),
            p["job"] + _notes(p),
        ]
        for p in found
    ]
    return render_lines(COLUMNS, rows, width=width)
