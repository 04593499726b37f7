"""The hourly rate of a machine the team owns: its total cost of ownership per GPU-hour.

The same formulas and defaults as `gpuopt tco`'s on-premises option (optimizer/costs/tco.py
`on_prem_plan` and `on_prem`), so that an owned offer's price and the TCO comparison cannot
drift apart: over a horizon equal to the machine's life, at a utilization u,
`usd_per_gpu_hour x gpus x busy hours` is `on_prem()`'s total (tests/test_costs_owned.py).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass

from optimizer import hardware
from optimizer.costs.tco import HOURS_PER_MONTH, Usage, on_prem_plan
from optimizer.costs.tco_assumptions import SERVER_USD, Assumptions
from optimizer.model import HOURS_PER_YEAR

OVERRIDES = (
    "capex_usd",
    "life_years",
    "power_kw",
    "pue",
    "usd_per_kwh",
    "ops_fraction_per_year",
    "utilization",
)
# A machine is expected busy every hour unless its owner says otherwise: the lowest rate,
# the cost of the capacity itself; a per-machine `utilization` override spreads the fixed
# costs over fewer hours.
DEFAULT_UTILIZATION = 1.0
# Written off over the tco command's default horizon when the assumptions give no period.
DEFAULT_LIFE_YEARS = 3.0


@dataclass(frozen=True, slots=True)
class OwnedCost:
    """One machine's TCO inputs (overridable per machine; defaults from the tco assumptions)."""

    gpus: int
    capex_usd: float  # the machine's price (server + its share of networking)
    life_years: float  # written off straight-line over this
    power_kw: float  # at the wall when busy (GPUs x TDP + host)
    idle_power_fraction: float
    pue: float
    usd_per_kwh: float
    ops_fraction_per_year: float  # operations, a yearly share of capex
    utilization: float  # expected busy share of hours (what the fixed costs are spread over)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {self.gpus}")
        if not 0 < self.utilization <= 1:
            raise ValueError(f"utilization must be within (0, 1], got {self.utilization}")
        if self.life_years <= 0:
            raise ValueError(f"life_years must be > 0, got {self.life_years}")


def breakdown(cost: OwnedCost) -> dict[str, float]:
    """Per GPU-hour of use: depreciation (capex / life), operations (capex x the yearly share)
    and power (busy power for the busy hours plus idle power for the idle ones, x PUE x
    $/kWh), each spread over the machine's busy GPU-hours in a year (gpus x hours x
    utilization). Resale is not counted (the on-premises default: resale_fraction 0)."""
    gpu_hours = cost.gpus * HOURS_PER_YEAR * cost.utilization
    kwh_usd = cost.pue * cost.usd_per_kwh
    idle_kw = cost.power_kw * cost.idle_power_fraction
    power_year = (
        HOURS_PER_YEAR
        * kwh_usd
        * (cost.power_kw * cost.utilization + idle_kw * (1 - cost.utilization))
    )
    return {
        "depreciation": cost.capex_usd / cost.life_years / gpu_hours,
        "operations": cost.capex_usd * cost.ops_fraction_per_year / gpu_hours,
        "power": power_year / gpu_hours,
    }


def usd_per_gpu_hour(cost: OwnedCost) -> float:
    """The machine's rate per busy GPU-hour: the sum of its `breakdown`."""
    return sum(breakdown(cost).values())


def owned_cost(
    gpus: int, gpu_model: str, overrides: Mapping[str, float], assumptions: Assumptions
) -> OwnedCost:
    """`gpus` GPUs of `gpu_model` in one machine: capex and busy power as `on_prem_plan`
    sizes them (server_usd from the assumptions or SERVER_USD, plus networking; GPUs x TDP
    from the hardware table plus the host), the rest from the on-premises assumptions, each
    replaced by `overrides` where given. Unknown keys and missing prices are ValueErrors."""
    for key in overrides:
        if key not in OVERRIDES:
            close = difflib.get_close_matches(key, OVERRIDES, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(
                f"unknown owned-cost override {key!r}{hint}; known: {', '.join(OVERRIDES)}"
            )
    p = assumptions.on_prem
    utilization = float(overrides.get("utilization", DEFAULT_UTILIZATION))
    life = float(overrides.get("life_years", p.depreciation_years or DEFAULT_LIFE_YEARS))
    capex = overrides.get("capex_usd")
    power = overrides.get("power_kw")
    if capex is None or power is None:
        server_usd = p.server_usd if p.server_usd is not None else SERVER_USD.get(gpu_model)
        if server_usd is None and capex is None:
            raise ValueError(
                f"no server price for {gpu_model}: give capex_usd for this machine "
                "(or on_prem.server_usd in the assumptions)"
            )
        spec = hardware.lookup(gpu_model)
        tdp = spec.tdp_w if spec is not None else None
        if tdp is None and power is None:
            raise ValueError(
                f"the hardware table has no TDP for {gpu_model}: give power_kw for this machine"
            )
        usage = Usage(gpu_model, gpus, HOURS_PER_MONTH * utilization, max(1, math.ceil(life)))
        plan = on_prem_plan(usage, tdp or 0.0, server_usd or 0.0, assumptions)
        capex = plan.capex_usd if capex is None else capex
        power = plan.busy_kw if power is None else power
    return OwnedCost(
        gpus=gpus,
        capex_usd=float(capex),
        life_years=life,
        power_kw=float(power),
        idle_power_fraction=p.idle_power_fraction,
        pue=float(overrides.get("pue", p.pue)),
        usd_per_kwh=float(overrides.get("usd_per_kwh", p.usd_per_kwh)),
        ops_fraction_per_year=float(
            overrides.get("ops_fraction_per_year", p.ops_fraction_per_year)
        ),
        utilization=utilization,
    )
