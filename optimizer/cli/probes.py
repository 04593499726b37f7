"""`gpuopt probes list`: the probe results agents reported, through the daemon's API
(`GET /probes`). `gpuopt probe` (singular) runs a probe on this machine."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from optimizer.cli.client import ApiOption, call, read
from optimizer.cli.common import fail

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
) -> None:
    """Probe results, newest first: verdict, measured TFLOPS and bandwidth per GPU."""
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
    for line in lines(found):
        print(line)


def _figure(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:,.1f} {unit}"


_SOURCE_NOTE = {"host": "host GPU", "simulated": "simulated"}
_KIND_NOTE = {"handover": "handover"}


def lines(found: list[dict[str, Any]]) -> list[str]:
    """The results as the terminal shows them, one line each under a header."""
    if not found:
        return ["no probe results"]
    out = [
        f"{'AT':<20} {'PROVIDER':<8} {'INSTANCE TYPE':<16} {'ZONE':<14} {'STATUS':<6} "
        f"{'BF16/GPU':>14} {'COPY/GPU':>14} {'JOB':<20}"
    ]
    for p in found:
        bf16 = p["tflops"].get("bf16")
        # Older daemons send `simulated` alone; a handover result has no TFLOPS of its own.
        source = p.get("source") or ("simulated" if p["simulated"] else "measured")
        notes = [n for n in (_SOURCE_NOTE.get(source), _KIND_NOTE.get(str(p.get("kind")))) if n]
        simulated = "".join(f" ({n})" for n in notes)
        out.append(
            f"{p['at']:<20} {p['provider']:<8} {p['instance_type']:<16} {p['zone'] or '-':<14} "
            f"{p['status']:<6} {_figure(bf16, 'TFLOPS'):>14} "
            f"{_figure(p['copy_gbps'], 'GB/s'):>14} {p['job']:<20}{simulated}"
        )
    return out
