"""Slow-changing AWS facts: GPU instance specs and zone name → zone ID maps, cached daily.

Both are kept in the SpecCache the caller passes (the store's prices repository implements
it), keyed per region: `instance-types/<region>` and `zones/<region>`. Raw AWS facts are
cached, not Offers, so a change to the hardware table applies without refetching.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from providers.base import SpecCache

PROVIDER = "aws"
SPEC_MAX_AGE = timedelta(hours=24)  # specs and zone maps: refreshed daily (issue 4, item 1)
# Every AWS GPU family starts with g or p (g4dn, g5, g6e, gr6, p4d, p5en, p6-b200 …); the
# wildcard narrows the listing server-side, and GpuInfo decides client-side. Wildcards in
# the `instance-type` filter: DescribeInstanceTypes API reference.
GPU_TYPE_PATTERNS = ("g*", "p*")
# EC2 refuses more than 200 values in one filter ("FilterLimitExceeded: The maximum number of
# filter values specified on a single call is 200", e.g. gjbae1212/gossm#31).
MAX_FILTER_VALUES = 200

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GpuType:
    """One GPU instance type as DescribeInstanceTypes states it (GpuInfo.Gpus[0] et al.)."""

    instance_type: str
    gpu_name: str
    gpu_manufacturer: str
    gpu_count: int
    gpu_memory_mib: int  # per GPU
    vcpus: int
    ram_mib: int
    network: str  # NetworkInfo.NetworkPerformance, e.g. "3200 Gigabit"
    efa: bool
    usage_classes: tuple[str, ...]  # on-demand, spot, capacity-block
    architectures: tuple[str, ...]  # x86_64, arm64
    efa_interfaces: int = 0  # NetworkInfo.EfaInfo.MaximumEfaInterfaces (0 in older caches)

    @property
    def sold_spot(self) -> bool:
        return "spot" in self.usage_classes

    @property
    def sold_on_demand(self) -> bool:
        return "on-demand" in self.usage_classes

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> GpuType:
        data = dict(value)
        data["usage_classes"] = tuple(data.get("usage_classes", ()))
        data["architectures"] = tuple(data.get("architectures", ()))
        return cls(**data)


def gpu_type(info: dict[str, Any]) -> GpuType | None:
    """The GpuType of one DescribeInstanceTypes entry; None without whole GPUs.

    Fractional types (g6f, gr6f: `Count` 0, a slice of one L4's memory) are skipped: an Offer
    counts whole GPUs, and a slice is not the GPU the hardware table describes.
    """
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if not gpus:
        return None
    first = gpus[0]
    count = sum(int(g.get("Count") or 0) for g in gpus)
    memory = int((first.get("MemoryInfo") or {}).get("SizeInMiB") or 0)
    if count <= 0 or memory <= 0:
        return None
    network = info.get("NetworkInfo") or {}
    return GpuType(
        instance_type=info["InstanceType"],
        gpu_name=str(first.get("Name") or ""),
        gpu_manufacturer=str(first.get("Manufacturer") or ""),
        gpu_count=count,
        gpu_memory_mib=memory,
        vcpus=int((info.get("VCpuInfo") or {}).get("DefaultVCpus") or 0),
        ram_mib=int((info.get("MemoryInfo") or {}).get("SizeInMiB") or 0),
        network=str(network.get("NetworkPerformance") or ""),
        efa=bool(network.get("EfaSupported")),
        usage_classes=tuple(info.get("SupportedUsageClasses") or ()),
        architectures=tuple((info.get("ProcessorInfo") or {}).get("SupportedArchitectures") or ()),
        efa_interfaces=int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 0),
    )


def list_gpu_types(ec2: Any) -> list[GpuType]:
    """Every GPU type the region's EC2 endpoint lists (one paginated chain)."""
    pages = ec2.get_paginator("describe_instance_types").paginate(
        Filters=[{"Name": "instance-type", "Values": list(GPU_TYPE_PATTERNS)}]
    )
    found = (gpu_type(info) for page in pages for info in page.get("InstanceTypes", []))
    return sorted((t for t in found if t is not None), key=lambda t: t.instance_type)


def zone_ids(ec2: Any) -> dict[str, str]:
    """Zone name → zone ID for the region. Names are per-account aliases; IDs are not."""
    reply = ec2.describe_availability_zones()
    return {z["ZoneName"]: z["ZoneId"] for z in reply.get("AvailabilityZones", [])}


def chunks(values: Sequence[T], size: int = MAX_FILTER_VALUES) -> Iterator[Sequence[T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def cached(
    cache: SpecCache,
    key: str,
    *,
    now: datetime,
    max_age: timedelta,
    fetch: Callable[[], T],
    encode: Callable[[T], Any],
    decode: Callable[[Any], T],
    on_stale: Callable[[Exception, datetime], None],
) -> T:
    """The cached value under `key` while younger than `max_age`, else a fresh fetch.

    A failed refresh falls back to an older copy (reported through `on_stale`); with no copy
    at all the fetch's error propagates.
    """
    hit = cache.load_cached(PROVIDER, key)
    if hit is not None and now - hit[0] < max_age:
        return decode(hit[1])
    try:
        value = fetch()
    except Exception as exc:
        if hit is None:
            raise
        on_stale(exc, hit[0])
        return decode(hit[1])
    cache.save_cached(PROVIDER, key, encode(value), now)
    return value


class MemoryCache:
    """A SpecCache kept in memory, for when the caller passes none."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], tuple[datetime, Any]] = {}

    def load_cached(self, provider: str, key: str) -> tuple[datetime, Any] | None:
        return self._values.get((provider, key))

    def save_cached(self, provider: str, key: str, value: Any, fetched_at: datetime) -> None:
        self._values[(provider, key)] = (fetched_at, value)


def encode_types(types: Iterable[GpuType]) -> list[dict[str, Any]]:
    return [t.to_json() for t in types]


def decode_types(value: Any) -> list[GpuType]:
    return [GpuType.from_json(v) for v in value]
