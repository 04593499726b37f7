"""What each zone sells (accelerator and machine types) and the priced offers that makes.

`read_accelerators` and `read_machines` turn the Compute API's aggregated lists into plain,
JSON-able specs (cached for a day); `build_offers` joins them with a PriceBook, and
`build_committed_offers` with the commitment price books. All pure.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from optimizer import hardware
from optimizer.model import Market, Offer, PaymentOption
from providers.gcp.billing import PriceBook, billing_series, instance_price
from providers.gcp.names import attached_instance_type, basename, region_of

SOURCE = "gcp-billing"
SPECS_VERSION = 1
_GONE = frozenset({"DEPRECATED", "OBSOLETE", "DELETED"})
_N1_HOST = re.compile(r"^n1-(?:standard|highmem|highcpu)-\d+$")

# GPUs attachable to N1 hosts: GPU count → (max vCPUs, max GiB of host memory), from the N1
# table of https://cloud.google.com/compute/docs/gpus (the same limits gpuhunt's
# `accelerator_limits` encodes, REFERENCE §2.1). P100 x4 uses the lower, every-zone limits.
N1_LIMITS: dict[str, dict[int, tuple[int, int]]] = {
    "nvidia-tesla-t4": {1: (48, 312), 2: (48, 312), 4: (96, 624)},
    "nvidia-tesla-v100": {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)},
    "nvidia-tesla-p100": {1: (16, 104), 2: (32, 208), 4: (64, 208)},
    "nvidia-tesla-p4": {1: (24, 156), 2: (48, 312), 4: (96, 624)},
}
# Sold only as Spot, Flex-start or reservations, never plain on-demand (GCP's GPU consumption
# options page, as gpuhunt's `GCPProvider.filter` cites it; REFERENCE §2.2).
_SPOT_ONLY = re.compile(r"^(?:a3-highgpu-[124]g|a3-ultragpu-.+|a4-.+|a4x-.+)$")


def sold_on_demand(machine_type: str) -> bool:
    return _SPOT_ONLY.match(machine_type) is None


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    name: str
    max_cards: int


@dataclass(frozen=True, slots=True)
class MachineSpec:
    name: str
    vcpus: int
    memory_mb: int
    accelerator: str | None = None  # built-in GPUs (a2, a3, a4, g2 …)
    accelerator_count: int = 0


@dataclass
class ZoneSpecs:
    """Per zone: the accelerator types and GPU-relevant machine types on sale."""

    accelerators: dict[str, list[AcceleratorSpec]] = field(default_factory=dict)
    machines: dict[str, list[MachineSpec]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SPECS_VERSION,
            "accelerators": {z: [asdict(a) for a in v] for z, v in self.accelerators.items()},
            "machines": {z: [asdict(m) for m in v] for z, v in self.machines.items()},
        }

    @classmethod
    def from_json(cls, value: Any) -> ZoneSpecs | None:
        """None when the value is not a current specs record (older format, damaged)."""
        try:
            if value.get("version") != SPECS_VERSION:
                return None
            return cls(
                {z: [AcceleratorSpec(**a) for a in v] for z, v in value["accelerators"].items()},
                {z: [MachineSpec(**m) for m in v] for z, v in value["machines"].items()},
            )
        except (AttributeError, KeyError, TypeError):
            return None

    @property
    def zones(self) -> list[str]:
        return sorted(set(self.accelerators) | set(self.machines))


def _gone(item: Any) -> bool:
    state = getattr(getattr(item, "deprecated", None), "state", "") or ""
    return str(getattr(state, "name", state)).upper() in _GONE


def read_accelerators(pairs: Iterable[tuple[str, Any]]) -> dict[str, list[AcceleratorSpec]]:
    """`(scope, AcceleratorTypesScopedList)` pairs → accelerator types per zone."""
    out: dict[str, list[AcceleratorSpec]] = defaultdict(list)
    for scope, scoped in pairs:
        for acc in getattr(scoped, "accelerator_types", ()):
            if not _gone(acc):
                out[basename(scope)].append(
                    AcceleratorSpec(acc.name, acc.maximum_cards_per_instance)
                )
    return dict(out)


def read_machines(pairs: Iterable[tuple[str, Any]]) -> dict[str, list[MachineSpec]]:
    """`(scope, MachineTypesScopedList)` pairs → GPU machine types and n1 hosts per zone."""
    out: dict[str, list[MachineSpec]] = defaultdict(list)
    for scope, scoped in pairs:
        for machine in getattr(scoped, "machine_types", ()):
            if _gone(machine):
                continue
            accelerators = list(getattr(machine, "accelerators", ()) or ())
            if accelerators:
                first = accelerators[0]
                spec = MachineSpec(
                    machine.name,
                    machine.guest_cpus,
                    machine.memory_mb,
                    first.guest_accelerator_type,
                    first.guest_accelerator_count,
                )
            elif _N1_HOST.match(machine.name):
                spec = MachineSpec(machine.name, machine.guest_cpus, machine.memory_mb)
            else:
                continue
            out[basename(scope)].append(spec)
    return dict(out)


@dataclass(frozen=True, slots=True)
class _Candidate:
    instance_type: str
    machine: MachineSpec
    accelerator: str
    count: int


def _candidates(specs: ZoneSpecs, zone: str) -> list[_Candidate]:
    found: list[_Candidate] = []
    machines = specs.machines.get(zone, [])
    for machine in machines:
        if machine.accelerator and machine.accelerator_count > 0:
            found.append(
                _Candidate(machine.name, machine, machine.accelerator, machine.accelerator_count)
            )
    ram = {m.name: m.memory_mb / 1024 for m in machines}
    for acc in specs.accelerators.get(zone, []):
        limits = N1_LIMITS.get(acc.name)
        if limits is None:
            continue
        for host in machines:
            if host.accelerator or not host.name.startswith("n1-"):
                continue
            for count, (max_cpus, max_gib) in limits.items():
                if count <= acc.max_cards and host.vcpus <= max_cpus and ram[host.name] <= max_gib:
                    kind = attached_instance_type(host.name, acc.name, count)
                    found.append(_Candidate(kind, host, acc.name, count))
    return found


@dataclass
class OfferBuild:
    offers: list[Offer] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def build_offers(
    specs: ZoneSpecs,
    book: PriceBook,
    *,
    observed_at: datetime,
    regions: Iterable[str] | None = None,
    keep_spot_above_on_demand: bool = False,
) -> OfferBuild:
    """One offer per (zone, instance type, market) that is on sale and priced."""
    wanted = set(regions) if regions is not None else None
    out = OfferBuild()
    unknown: dict[str, set[str]] = defaultdict(set)
    no_series: set[str] = set()
    unpriced: dict[tuple[str, Market, str], set[str]] = defaultdict(set)
    inverted: dict[tuple[str, str], tuple[float, float]] = {}
    for zone in specs.zones:
        region = region_of(zone)
        if wanted is not None and region not in wanted:
            continue
        for cand in _candidates(specs, zone):
            model = hardware.from_gcp(cand.accelerator)
            if not model.known:
                if cand.accelerator.startswith(("nvidia-", "amd-")):  # TPUs are no concern
                    unknown[cand.accelerator].add(cand.instance_type)
                continue
            if billing_series(cand.machine.name) is None:
                no_series.add(cand.machine.name)
                continue
            ram_gib = cand.machine.memory_mb / 1024
            quotes = {
                market: instance_price(
                    book,
                    region=region,
                    market=market,
                    machine_type=cand.machine.name,
                    vcpus=cand.machine.vcpus,
                    ram_gib=ram_gib,
                    accelerator=cand.accelerator,
                    gpu_count=cand.count,
                )
                for market in (Market.ON_DEMAND, Market.SPOT)
            }
            spot, on_demand = quotes[Market.SPOT].usd, quotes[Market.ON_DEMAND].usd
            spot_inverted = False
            if spot is not None and on_demand is not None and spot > on_demand:
                inverted[(region, cand.instance_type)] = (spot, on_demand)
                spot_inverted = True
            for market, quote in quotes.items():
                if market is Market.ON_DEMAND and not sold_on_demand(cand.machine.name):
                    continue
                if quote.usd is None:
                    for part in quote.missing:
                        unpriced[(region, market, part)].add(cand.instance_type)
                    continue
                if market is Market.SPOT and spot_inverted and not keep_spot_above_on_demand:
                    continue
                out.offers.append(_offer(cand, region, zone, market, quote.usd, observed_at))
    for acc, kinds in sorted(unknown.items()):
        out.problems.append(
            f"accelerator type {acc} is not in the hardware table; {_few(kinds)} not offered"
        )
    listed = {region_of(z) for z in specs.zones}
    for region in sorted((wanted or set()) - listed):
        out.problems.append(f"{region}: no zone lists GPU machine types; nothing offered")
    if no_series:
        out.problems.append(f"no billing series known for {_few(no_series)}; not priced")
    for (region, market, part), kinds in sorted(unpriced.items()):
        out.problems.append(f"{region} {market}: no {part} SKU; {_few(kinds)} not priced")
    action = "kept" if keep_spot_above_on_demand else "spot offer dropped"
    for (region, kind), (spot, on_demand) in sorted(inverted.items()):
        out.problems.append(
            f"{region} {kind}: spot ${spot:.4f}/h is above on-demand ${on_demand:.4f}/h; {action}"
        )
    return out


def _offer(
    cand: _Candidate,
    region: str,
    zone: str | None,
    market: Market,
    usd: float,
    observed_at: datetime,
    **terms: Any,
) -> Offer:
    model = hardware.from_gcp(cand.accelerator)
    fabric = hardware.gcp_fabric(cand.instance_type)
    return Offer(
        provider="gcp",
        region=region,
        zone=zone,
        instance_type=cand.instance_type,
        gpu_model=model.name,
        gpu_count=cand.count,
        gpu_memory_gib=model.memory_gib,
        vcpus=cand.machine.vcpus,
        ram_gib=cand.machine.memory_mb / 1024,
        interconnect=hardware.gcp_interconnect(cand.machine.name, cand.count),
        fabric=fabric.fabric,
        fabric_interfaces=fabric.interfaces,
        market=market,
        usd_per_hour=usd,
        observed_at=observed_at,
        source=SOURCE,
        **terms,
    )


def build_committed_offers(
    specs: ZoneSpecs,
    books: Mapping[int, PriceBook],
    *,
    observed_at: datetime,
    regions: Iterable[str] | None = None,
) -> OfferBuild:
    """One committed offer per (region, instance type, term) that the term's commitment SKUs
    price whole (cores, RAM and GPUs): zone none, as a commitment is bought per region; no
    upfront, as GCP bills commitments monthly. A type they cannot price is left out, and
    one line per term says how many were and which SKUs were missing."""
    wanted = set(regions) if regions is not None else None
    out = OfferBuild()
    seen: set[tuple[str, str]] = set()
    missing: dict[int, set[str]] = defaultdict(set)
    unpriced: dict[int, set[tuple[str, str]]] = defaultdict(set)
    for zone in specs.zones:
        region = region_of(zone)
        if wanted is not None and region not in wanted:
            continue
        for cand in _candidates(specs, zone):
            if (region, cand.instance_type) in seen:
                continue
            seen.add((region, cand.instance_type))
            if not hardware.from_gcp(cand.accelerator).known:
                continue  # reported with the on-demand offers
            if billing_series(cand.machine.name) is None:
                continue
            for term, book in sorted(books.items()):
                quote = instance_price(
                    book,
                    region=region,
                    market=Market.COMMITTED,
                    machine_type=cand.machine.name,
                    vcpus=cand.machine.vcpus,
                    ram_gib=cand.machine.memory_mb / 1024,
                    accelerator=cand.accelerator,
                    gpu_count=cand.count,
                )
                if quote.usd is None:
                    missing[term].update(quote.missing)
                    unpriced[term].add((region, cand.instance_type))
                    continue
                out.offers.append(
                    _offer(
                        cand,
                        region,
                        None,
                        Market.COMMITTED,
                        quote.usd,
                        observed_at,
                        term_years=term,
                        payment_option=PaymentOption.NO_UPFRONT,
                        upfront_usd=0.0,
                    )
                )
    for term, pairs in sorted(unpriced.items()):
        out.problems.append(
            f"committed {term}-year: {len(pairs)} region/type pair(s) not priced "
            f"(no commitment SKU for {_few(missing[term])})"
        )
    return out


def _few(names: set[str], shown: int = 3) -> str:
    ordered = sorted(names)
    more = f" and {len(ordered) - shown} more" if len(ordered) > shown else ""
    return ", ".join(ordered[:shown]) + more
