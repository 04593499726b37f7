"""`gpuopt tco --from-history`: the spot overhead and the usage, from the daemon's ledger.

Two reads of `GET /costs` (docs/costs.md): grouped by market, the spot group's overhead
seconds per useful second (billed seconds less overhead) is the spot overhead fraction;
grouped by month, the mean billed hours of the months with any is the usage, taken as
hours of the compared capacity (the jobs are assumed to have run on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optimizer.cli.client import NoDaemon, call, request
from optimizer.costs.tco import HOURS_PER_MONTH


@dataclass
class History:
    overhead_fraction: float | None = None
    hours_per_month: float | None = None
    notes: list[str] = field(default_factory=list)


def from_groups(
    by_market: list[dict[str, Any]],
    by_month: list[dict[str, Any]],
    *,
    capacity: str = "the compared capacity",
    default_overhead: float | None = None,
) -> History:
    """What the ledger's groups say (pure: the two `/costs` answers in, the figures out);
    `capacity` names what the usage is read as hours of (`8x H100-80GB`), `default_overhead`
    the spot overhead used when the ledger has none."""
    out = History()
    for group in by_market:
        if group.get("group") != "spot":
            continue
        billed = float(group.get("billed_seconds") or 0)
        overhead = float(group.get("overhead_seconds") or 0)
        if billed > overhead:
            out.overhead_fraction = overhead / (billed - overhead)
            out.notes.append(
                f"spot overhead {out.overhead_fraction:.1%} from the ledger: "
                f"{overhead / 3600:,.1f} h billed without a job running for "
                f"{(billed - overhead) / 3600:,.1f} h of work ({billed / 3600:,.1f} spot hours "
                "billed in all)"
            )
    if out.overhead_fraction is None:
        kept = "" if default_overhead is None else f" ({default_overhead:.0%})"
        out.notes.append(
            f"the ledger has no spot hours yet: the assumptions' spot.overhead_fraction{kept} "
            "is used"
        )
    months = [float(g.get("billed_seconds") or 0) / 3600 for g in by_month]
    months = [h for h in months if h > 0]
    if months:
        out.hours_per_month = sum(months) / len(months)
        out.notes.append(
            f"usage {out.hours_per_month:,.1f} h/month: the mean instance-hours billed per "
            f"month over the {len(months)} month(s) the ledger has, read as hours of {capacity}"
        )
    return out


def owned_usage(machines: list[dict[str, Any]], out: History) -> None:
    """The owned machines' measured utilization as the usage (docs/owned.md): the GPU-weighted
    mean of each machine's GPU-hours held over GPU-hours it had, times the hours in a month.
    It replaces the ledger's billed hours, which count cloud hours too; nothing changes when
    no machine has a measured figure yet."""
    measured = [
        (float(m["utilization"]), int(m.get("gpus") or 0))
        for m in machines
        if m.get("utilization") is not None and int(m.get("gpus") or 0) > 0
    ]
    if not measured:
        return
    gpus = sum(n for _, n in measured)
    share = sum(u * n for u, n in measured) / gpus
    out.hours_per_month = share * HOURS_PER_MONTH
    out.notes.append(
        f"usage {out.hours_per_month:,.1f} h/month: the owned machines' measured utilization "
        f"({share:.1%} over {len(measured)} machine(s), {gpus} GPUs) x {HOURS_PER_MONTH:g} h"
    )


def read_history(
    api: str | None,
    policy: str | None,
    *,
    capacity: str = "the compared capacity",
    default_overhead: float | None = None,
) -> History:
    """Ask the daemon's ledger (the policy's lines only, when one is named)."""
    params: dict[str, str] = {} if policy is None else {"policy": policy}
    by_market = call("GET", "/costs", api, params={**params, "by": "market"})
    by_month = call("GET", "/costs", api, params={**params, "by": "month"})
    out = from_groups(by_market, by_month, capacity=capacity, default_overhead=default_overhead)
    try:
        response = request("GET", "/machines", api)
    except NoDaemon:
        return out
    if response.status_code == 200:  # 404: the daemon has no owned machines
        owned_usage(list(response.json().get("machines", [])), out)
    return out
