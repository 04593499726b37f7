"""The TCO assumptions: what `gpuopt tco` cannot read from prices, each default with its source.

A person edits these in a YAML file (`--assumptions tco.yaml`, docs/tco.md has every key);
anything the file leaves out keeps its default. `SOURCES` names where every default comes
from and how sure it is (the reference sheet's words: confirmed, secondary, unconfirmed, or
no source: a guess to replace with your own figure). Bad values are located errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from optimizer.common.documents import load_document
from optimizer.common.errors import LocatedError


class AssumptionsError(LocatedError):
    """An assumptions file that cannot be used."""


@dataclass(frozen=True, slots=True)
class Sourced:
    """Where a default comes from, and how sure that source is."""

    source: str
    confidence: str  # confirmed | secondary | unconfirmed | no source


# The on-premises server price per GPU model, for the models a source prices; any other
# model needs `on_prem.server_usd` in the file (NVIDIA publishes no list prices).
SERVER_USD: dict[str, float] = {"H100-80GB": 200_000.0}

SOURCES: dict[str, Sourced] = {
    "spot.overhead_fraction": Sourced(
        "a guess: 10% more billed hours than useful ones (probes, restarts, work redone since "
        "the last checkpoint); --from-history reads the cost ledger's own figure instead",
        "no source",
    ),
    "spot.on_demand_share": Sourced(
        "the selection guide's budget example: spot for 80% of the training hours, so 20% "
        "runs on the on-demand fallback",
        "no source",
    ),
    "spot.discount": Sourced(
        "GCP Spot VMs page, '60-91% discounts for most machine types and GPUs' "
        "(https://cloud.google.com/compute/docs/instances/spot), the low end; a3-highgpu-8g "
        "spot is 60.0% under on-demand in us-central1 (Cyclenerd/google-cloud-pricing-cost-"
        "calculator pricing.yml@0166a59, 2025-03-06). Used only when no spot price is offered",
        "confirmed",
    ),
    "commitment.discount_1y": Sourced(
        "a3-highgpu-8g (8x H100) 1-year CUD, 30.6% under on-demand in us-central1 "
        "(pricing.yml@0166a59, from the Cloud Billing Catalog). Used only when no committed "
        "offer is found",
        "confirmed",
    ),
    "commitment.discount_3y": Sourced(
        "a3-highgpu-8g 3-year CUD, 56.1% under on-demand in us-central1 (pricing.yml@0166a59). "
        "Used only when no committed offer is found",
        "confirmed",
    ),
    "on_prem.gpus_per_server": Sourced("HGX/DGX 8-GPU servers (NVIDIA DGX H100/H200)", "secondary"),
    "on_prem.server_usd": Sourced(
        "H100-80GB: $200,000 per 8-GPU server: DGX H100 'base price $199,000' "
        "(https://www.supercluster.blog/p/4-nvidia-dgx-h100-hardware) and '$180K-220K capex' "
        "per 8x H100 node (https://theneuralbase.com/ai-infrastructure/learn/advanced/"
        "h100-tdp-700w/); NVIDIA publishes no list price. Other GPUs: none, give your quote",
        "unconfirmed",
    ),
    "on_prem.networking_usd_per_server": Sourced(
        "none counted by default: add your switches, NICs and cabling", "no source"
    ),
    "on_prem.host_power_w": Sourced(
        "DGX H100/H200 10.2 kW maximum input (https://unanswered.io/guide/nvidia-dgx-power-"
        "consumption-watts, citing the DGX H100/H200 user guide) less 8 x 700 W GPU TDP",
        "secondary",
    ),
    "on_prem.idle_power_fraction": Sourced(
        "a guess: an idle server draws 30% of its busy power", "no source"
    ),
    "on_prem.pue": Sourced(
        "Uptime Institute industry average PUE, 1.58 in 2023 (https://intelligence."
        "uptimeinstitute.com/resource/large-data-centers-are-mostly-more-efficient-analysis-"
        "confirms)",
        "confirmed",
    ),
    "on_prem.usd_per_kwh": Sourced(
        "EIA Electric Power Annual 2023, Virginia industrial average 8.92 cents/kWh "
        "(https://www.eia.gov/electricity/annual/secrev-map.php)",
        "confirmed",
    ),
    "on_prem.ops_fraction_per_year": Sourced(
        "DGX H100 '~$39,800 1-yr support' on a $199,000 base, 20% a year "
        "(https://www.supercluster.blog/p/4-nvidia-dgx-h100-hardware); staff and space not "
        "included",
        "unconfirmed",
    ),
    "on_prem.depreciation_years": Sourced(
        "the horizon itself (the hardware is written off over the years compared)", "no source"
    ),
    "on_prem.resale_fraction": Sourced(
        "none: no resale value is counted unless you give one", "no source"
    ),
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpotAssumptions(_Section):
    overhead_fraction: float = Field(
        0.10,
        ge=0,
        le=10,
        description="Billed hours that do no work, per useful hour, on spot.",
        examples=[0.1],
    )
    on_demand_share: float = Field(
        0.20,
        ge=0,
        le=1,
        description="Share of the hours spot capacity is missing and on-demand runs instead.",
        examples=[0.2],
    )
    discount: float = Field(
        0.60,
        ge=0,
        lt=1,
        description="Spot price under on-demand, used only when no spot price is offered.",
        examples=[0.6],
    )


class CommitmentAssumptions(_Section):
    discount_1y: float = Field(
        0.306, ge=0, lt=1, description="1-year rate under on-demand, when none is offered."
    )
    discount_3y: float = Field(
        0.561, ge=0, lt=1, description="3-year rate under on-demand, when none is offered."
    )


class OnPremAssumptions(_Section):
    gpus_per_server: int = Field(8, ge=1, le=64, description="GPUs in one server.")
    server_usd: float | None = Field(
        None,
        ge=0,
        description="One server's price, GPUs included (default: a sourced price for the GPU).",
        examples=[200000],
    )
    networking_usd_per_server: float = Field(0.0, ge=0, description="Network gear per server.")
    host_power_w: float = Field(
        4600.0, ge=0, description="A server's power beyond its GPUs' TDP, watts."
    )
    idle_power_fraction: float = Field(
        0.30, ge=0, le=1, description="Power drawn when idle, as a share of the busy power."
    )
    pue: float = Field(1.58, ge=1, le=5, description="Power usage effectiveness.")
    usd_per_kwh: float = Field(0.0892, ge=0, le=10, description="Electricity price, USD per kWh.")
    ops_fraction_per_year: float = Field(
        0.20, ge=0, le=5, description="Operations per year, as a share of the capex."
    )
    depreciation_years: float | None = Field(
        None, gt=0, le=30, description="Straight-line depreciation period (default: the horizon)."
    )
    resale_fraction: float = Field(
        0.0, ge=0, le=1, description="Sale value at the end of depreciation, share of capex."
    )


class Assumptions(_Section):
    """Every assumption `gpuopt tco` makes beyond the prices it reads."""

    spot: SpotAssumptions = Field(
        default_factory=SpotAssumptions, examples=[{"overhead_fraction": 0.1}]
    )
    commitment: CommitmentAssumptions = Field(
        default_factory=CommitmentAssumptions, examples=[{"discount_1y": 0.3}]
    )
    on_prem: OnPremAssumptions = Field(
        default_factory=OnPremAssumptions, examples=[{"pue": 1.3, "usd_per_kwh": 0.12}]
    )


def load_assumptions(path: str | Path) -> Assumptions:
    """Read an assumptions file; every problem is an AssumptionsError naming file, line, field."""
    return load_document(
        path, Assumptions, interpolate=False, what="TCO assumptions", error=AssumptionsError
    )


def described(values: Assumptions, given: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Each assumption's value with its source: `from file` for the ones `given` names, else
    the default's source and confidence (the `assumptions` part of `gpuopt tco --json`)."""
    out: dict[str, Any] = {}
    for key, sourced in SOURCES.items():
        section, name = key.split(".")
        value = getattr(getattr(values, section), name)
        if key in given:
            out[key] = {"value": value, "source": "the assumptions file", "confidence": "yours"}
        else:
            out[key] = {"value": value, "source": sourced.source, "confidence": sourced.confidence}
    return out


def given_keys(values: Assumptions) -> frozenset[str]:
    """The dotted keys an assumptions file set (pydantic remembers which fields were given)."""
    keys: set[str] = set()
    for section in ("spot", "commitment", "on_prem"):
        if section in values.model_fields_set:
            part: BaseModel = getattr(values, section)
            keys.update(f"{section}.{name}" for name in part.model_fields_set)
    return frozenset(keys)
