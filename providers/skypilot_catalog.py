"""Read SkyPilot catalog (schema v7) GPU rows for AWS and GCP into Offers.

The SkyPilot catalog republishes each cloud's public price lists as CSV; gpuopt reads it for
tests, benchmarks and to derive the bundled list-price snapshot. Layout notes (see the
catalog's own description of these files):
- AWS: one row per (instance type, zone ID), whole-instance on-demand `Price` and per-zone
  `SpotPrice`; `GpuInfo` is a Python-dict-style string.
- GCP: host machine rows and GPU rows are separate; a GPU VM costs host + GPUs in the same
  zone, for machine types with built-in GPUs (a2, a3, g2) and for n1 hosts with attached GPUs.
"""

from __future__ import annotations

import ast
import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from optimizer import hardware
from optimizer.model import Market, Offer
from providers.gcp.names import attached_instance_type  # shared with the live GCP adapter

SOURCE = "skypilot-catalog-v7"

# GCP machine types with built-in GPUs: (catalog accelerator name, GPUs per VM).
# Source: GCP GPU machine types page, as tabulated in the reference (§2.2).
_G2_L4 = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
_BUILT_IN = [
    (re.compile(r"a2-highgpu-(\d+)g"), "A100"),
    (re.compile(r"a2-megagpu-(\d+)g"), "A100"),
    (re.compile(r"a2-ultragpu-(\d+)g"), "A100-80GB"),
    (re.compile(r"a3-highgpu-(\d+)g"), "H100"),
    (re.compile(r"a3-edgegpu-(\d+)g(?:-nolssd)?"), "H100"),
    (re.compile(r"a3-megagpu-(\d+)g"), "H100-MEGA"),
    (re.compile(r"a3-ultragpu-(\d+)g(?:-nolssd)?"), "H200"),
]
# GPUs attached to n1 hosts, by the catalog's name, with the GCP accelerator type.
N1_ATTACHABLE = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
}


class SkyPilotCatalogError(ValueError):
    """A SkyPilot catalog row this reader cannot understand."""


def built_in_gpus(machine_type: str) -> tuple[str, int] | None:
    """(catalog accelerator name, count) for a GCP machine type with built-in GPUs."""
    if machine_type.startswith("g2-standard-"):
        count = _G2_L4.get(int(machine_type.rsplit("-", 1)[1]))
        return ("L4", count) if count else None
    for pattern, name in _BUILT_IN:
        match = pattern.fullmatch(machine_type)
        if match:
            return name, int(match.group(1))
    return None


def _price(raw: str) -> float | None:
    return float(raw) if raw.strip() else None


@dataclass(frozen=True)
class _Spec:
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gib: float
    vcpus: int
    ram_gib: float


def _offers(
    provider: str,
    spec: _Spec,
    region: str,
    zone: str,
    prices: dict[Market, float | None],
    observed_at: datetime,
) -> Iterator[Offer]:
    interconnect = hardware.instance_interconnect(provider, spec.instance_type, spec.gpu_count)
    fabric = hardware.instance_fabric(provider, spec.instance_type)
    for market, price in prices.items():
        if price is None:
            continue
        yield Offer(
            provider=provider,
            region=region,
            zone=zone or None,
            instance_type=spec.instance_type,
            gpu_model=spec.gpu_model,
            gpu_count=spec.gpu_count,
            gpu_memory_gib=spec.gpu_memory_gib,
            vcpus=spec.vcpus,
            ram_gib=spec.ram_gib,
            interconnect=interconnect,
            fabric=fabric.fabric,
            fabric_interfaces=fabric.interfaces,
            market=market,
            usd_per_hour=price,
            observed_at=observed_at,
            source=SOURCE,
        )


def read_aws(path: str | Path, observed_at: datetime) -> list[Offer]:
    """AWS rows: one on-demand and (where listed) one spot offer per (type, zone ID)."""
    offers: list[Offer] = []
    seen: set[tuple[str, str]] = set()
    with open(path, encoding="utf-8", newline="") as stream:
        for row in csv.DictReader(stream):
            key = (row["InstanceType"], row["AvailabilityZone"])
            if key in seen:  # p4de appears twice in some zones (A100 and A100-80GB names)
                continue
            seen.add(key)
            info = ast.literal_eval(row["GpuInfo"])
            gpu = info["Gpus"][0]
            memory_mib = gpu["MemoryInfo"]["SizeInMiB"]
            model = hardware.from_aws(gpu["Name"], memory_mib, gpu.get("Manufacturer"))
            spec = _Spec(
                instance_type=row["InstanceType"],
                gpu_model=model.name,
                gpu_count=int(float(row["AcceleratorCount"])),
                gpu_memory_gib=memory_mib / 1024,
                vcpus=int(float(row["vCPUs"])),
                ram_gib=float(row["MemoryGiB"]),
            )
            prices = {
                Market.ON_DEMAND: _price(row["Price"]),
                Market.SPOT: _price(row["SpotPrice"]),
            }
            offers.extend(
                _offers("aws", spec, row["Region"], row["AvailabilityZone"], prices, observed_at)
            )
    return offers


def read_gcp(path: str | Path, observed_at: datetime) -> list[Offer]:
    """GCP rows: each GPU VM priced as host + GPUs in one zone."""
    hosts: list[dict[str, str]] = []
    gpus: dict[tuple[str, str, int], dict[str, str]] = {}  # (zone, name, count) -> row
    with open(path, encoding="utf-8", newline="") as stream:
        for row in csv.DictReader(stream):
            if row["InstanceType"]:
                hosts.append(row)
            elif row["AcceleratorName"]:
                count = int(float(row["AcceleratorCount"]))
                gpus[(row["AvailabilityZone"], row["AcceleratorName"], count)] = row

    offers: list[Offer] = []
    for host in hosts:
        machine = host["InstanceType"]
        zone = host["AvailabilityZone"]
        if machine.startswith("n1-"):
            combos = [
                (attached_instance_type(machine, N1_ATTACHABLE[name], count), name, count)
                for (gpu_zone, name, count) in gpus
                if gpu_zone == zone and name in N1_ATTACHABLE
            ]
        else:
            built_in = built_in_gpus(machine)
            if built_in is None:
                raise SkyPilotCatalogError(f"unknown GCP GPU machine type {machine!r}")
            combos = [(machine, *built_in)]
        for instance_type, name, count in sorted(combos):
            gpu_row = gpus.get((zone, name, count))
            if gpu_row is None:
                continue  # host sold here without that GPU: not a GPU offer
            model = hardware.from_gcp(name)
            # GCP's APIs state no GPU memory (the catalog's figure is its own table), so a
            # known model takes the hardware table's, which matches what AWS and NVML report.
            listed = ast.literal_eval(gpu_row["GpuInfo"])["Gpus"][0]["MemoryInfo"]["SizeInMiB"]
            spec = _Spec(
                instance_type=instance_type,
                gpu_model=model.name,
                gpu_count=count,
                gpu_memory_gib=model.memory_gib if model.known else listed / 1024,
                vcpus=int(float(host["vCPUs"])),
                ram_gib=float(host["MemoryGiB"]),
            )
            prices: dict[Market, float | None] = {}
            for market, column in ((Market.ON_DEMAND, "Price"), (Market.SPOT, "SpotPrice")):
                host_price, gpu_price = _price(host[column]), _price(gpu_row[column])
                both = host_price is not None and gpu_price is not None
                prices[market] = round(host_price + gpu_price, 6) if both else None  # type: ignore[operator]
            offers.extend(_offers("gcp", spec, host["Region"], zone, prices, observed_at))
    return offers


def read_directory(directory: str | Path, observed_at: datetime) -> list[Offer]:
    """Both clouds from a folder holding `aws_gpu_vms.csv` and `gcp_gpu_vms.csv`."""
    directory = Path(directory)
    return read_aws(directory / "aws_gpu_vms.csv", observed_at) + read_gcp(
        directory / "gcp_gpu_vms.csv", observed_at
    )
