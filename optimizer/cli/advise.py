"""`gpuopt advise JOB`: rightsizing advice for one job, through the daemon's API
(`GET /jobs/{name}/advice`; docs/advice.md explains the figures)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Annotated

import typer

from optimizer.cli.client import ApiOption, call, read
from optimizer.cli.common import fail

if TYPE_CHECKING:
    from optimizer.answers import AdviceView

JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]
_STATUS = {
    "cheaper_fit": "cheaper fit",
    "no_cheaper_fit": "no cheaper fit",
    "no_telemetry": "no telemetry yet",
}


def advise(
    job: Annotated[str, typer.Argument(help="The job's name.", show_default=False)],
    api: ApiOption = None,
    as_json: JsonOption = False,
) -> None:
    """Rightsizing advice: the cheapest offer the job's policy allows that fits its measured
    peak GPU memory (x the policy's buffer), and the saving per month at its duty cycle."""
    from optimizer.answers import AdviceView  # pydantic's import: only when a command runs
    from policies.schema import NAME_PATTERN

    if not re.fullmatch(NAME_PATTERN, job):
        fail(
            f"job {job!r}: a job name is 1-63 lowercase letters, digits and dashes, "
            "starting and ending with a letter or digit"
        )
    answer = call("GET", f"/jobs/{job}/advice", api)
    found = read(AdviceView, answer)
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    for line in lines(found):
        print(line)


def lines(found: AdviceView) -> list[str]:
    """The advice as the terminal shows it."""
    out = [
        f"{found.job} (policy {found.policy}): {_STATUS.get(found.status, found.status)}",
        f"  {found.reason}",
    ]
    now, advised = found.current, found.advised
    if now is not None and found.status != "no_telemetry":
        out.append(
            f"  now:     {now['provider']} {now['instance_type']} {now['market']} in "
            f"{now['region']} at ${now['usd_per_hour']:.4g}/h"
        )
    if advised is not None and found.status == "cheaper_fit":
        o = advised["offer"]
        out.append(
            f"  advised: {o['provider']} {o['instance_type']} {o['market']} in {o['region']} "
            f"({o['gpu_count']}x {o['gpu_model']}, {o['gpu_memory_gib']:g} GiB each) "
            f"at ${o['usd_per_hour']:.4g}/h"
        )
        duty = found.duty_cycle
        out.append(
            f"  saving:  ${found.usd_per_hour_saving:.4g}/h, "
            f"${found.monthly_saving_usd:,.2f}/month at {duty['hours_per_month']:.0f} h/month"
        )
    out.extend(f"  note: {note}" for note in found.notes)
    return out
