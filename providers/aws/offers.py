"""Per-region offer assembly: zonal offerings, the latest spot price per pool, placement scores.

The fetchers make one paginated chain each per region; `build_offers` is a pure function of
what they return, so the rules (latest price wins, zone IDs not names, spot only where the
type is offered) are tested without AWS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from optimizer import hardware
from optimizer.clock import parse_utc
from optimizer.model import Fabric, Market, Offer
from providers.aws.specs import GpuType, chunks

SOURCE = "aws-api"
# Both Linux descriptions, as Karpenter's UpdateSpotPricing passes (REFERENCE.md §1.2).
SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
SPOT_PAGE_SIZE = 1000  # DescribeSpotPriceHistory MaxResults upper bound
# GetSpotPlacementScores: RegionNames holds at most 10 (botocore service model).
SCORE_REGIONS_PER_CALL = 10

TypeInZone = tuple[str, str]  # (instance type, zone name): a spot price history key


def offered_zones(ec2: Any, instance_types: Sequence[str]) -> dict[str, set[str]]:
    """{instance type: zone names where it is sold}; an offering is not a capacity promise."""
    offered: dict[str, set[str]] = {}
    for part in chunks(sorted(instance_types)):
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": list(part)}],
        )
        for page in pages:
            for row in page.get("InstanceTypeOfferings", []):
                offered.setdefault(row["InstanceType"], set()).add(row["Location"])
    return offered


def spot_history(ec2: Any, instance_types: Sequence[str], now: datetime) -> list[dict[str, Any]]:
    """Spot price rows in effect at `now` (StartTime=now) for the types, every zone."""
    rows: list[dict[str, Any]] = []
    for part in chunks(sorted(instance_types)):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=list(part),
            ProductDescriptions=list(SPOT_PRODUCTS),
            StartTime=now,
            PaginationConfig={"PageSize": SPOT_PAGE_SIZE},
        )
        for page in pages:
            rows.extend(page.get("SpotPriceHistory", []))
    return rows


def _utc(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return parse_utc(str(value)).astimezone(UTC)


def latest_spot_prices(rows: Iterable[Mapping[str, Any]]) -> dict[TypeInZone, float]:
    """{(type, zone name): USD per hour}: the newest row per pool wins, older ones are ignored.

    Rows at the same instant (the two Linux descriptions) resolve to the lower price.
    """
    best: dict[TypeInZone, tuple[datetime, float]] = {}
    for row in rows:
        if row.get("ProductDescription") not in SPOT_PRODUCTS:
            continue
        try:
            usd = float(row["SpotPrice"])
        except (KeyError, TypeError, ValueError):
            continue
        if not usd > 0:
            continue
        pool = (row["InstanceType"], row["AvailabilityZone"])
        when = _utc(row["Timestamp"])
        seen = best.get(pool)
        if seen is None or when > seen[0] or (when == seen[0] and usd < seen[1]):
            best[pool] = (when, usd)
    return {pool: usd for pool, (_, usd) in best.items()}


def score_groups(types: Iterable[GpuType]) -> list[tuple[str, ...]]:
    """Types that can stand in for each other (same GPU model and count), one group each.

    AWS scores a set of types together and warns that one or two types always score low
    (GetSpotPlacementScores `InstanceTypes` documentation), so a score is asked per group.
    """
    groups: dict[tuple[str, int], list[str]] = {}
    for t in types:
        model = hardware.from_aws(t.gpu_name, t.gpu_memory_mib, t.gpu_manufacturer).name
        groups.setdefault((model, t.gpu_count), []).append(t.instance_type)
    return sorted(tuple(sorted(v)) for v in groups.values())


def placement_scores(
    ec2: Any, instance_types: Sequence[str], regions: Sequence[str]
) -> dict[str, float]:
    """{zone ID: score 1-10} for launching one unit of any of `instance_types` there."""
    scores: dict[str, float] = {}
    for part in chunks(sorted(regions), SCORE_REGIONS_PER_CALL):
        pages = ec2.get_paginator("get_spot_placement_scores").paginate(
            InstanceTypes=list(instance_types),
            TargetCapacity=1,
            TargetCapacityUnitType="units",
            SingleAvailabilityZone=True,
            RegionNames=list(part),
        )
        for page in pages:
            for row in page.get("SpotPlacementScores", []):
                zone = row.get("AvailabilityZoneId")
                if zone and row.get("Score") is not None:
                    scores[zone] = float(row["Score"])
    return scores


def build_offers(
    region: str,
    types: Mapping[str, GpuType],
    zone_ids: Mapping[str, str],
    offered: Mapping[str, set[str]],
    spot: Mapping[TypeInZone, float],
    on_demand: Mapping[str, float],
    scores: Mapping[tuple[str, str], float],
    observed_at: datetime,
) -> list[Offer]:
    """The region's offers: spot per zone ID with its latest price, on-demand per zone ID
    where the type is offered (the region's list price, repeated per zone).

    `scores` is keyed by (zone ID, instance type). Zones missing from `zone_ids` (a stale
    map) are skipped rather than reported under an account-specific name.
    """
    out: list[Offer] = []
    for name in sorted(offered):
        spec = types.get(name)
        if spec is None:
            continue
        model = hardware.from_aws(spec.gpu_name, spec.gpu_memory_mib, spec.gpu_manufacturer)
        shape: dict[str, Any] = {
            "provider": "aws",
            "region": region,
            "instance_type": name,
            "gpu_model": model.name,
            "gpu_count": spec.gpu_count,
            "gpu_memory_gib": spec.gpu_memory_mib / 1024,
            "vcpus": spec.vcpus,
            "ram_gib": spec.ram_mib / 1024,
            "interconnect": hardware.aws_interconnect(name, spec.gpu_count),
            **_fabric(spec),
            "observed_at": observed_at,
            "source": SOURCE,
        }
        for zone_name in sorted(offered[name], key=lambda z: zone_ids.get(z, z)):
            zone = zone_ids.get(zone_name)
            if zone is None:
                continue
            spot_price = spot.get((name, zone_name))
            if spec.sold_spot and spot_price is not None:
                out.append(
                    Offer(
                        **shape,
                        zone=zone,
                        market=Market.SPOT,
                        usd_per_hour=spot_price,
                        placement_score=scores.get((zone, name)),
                    )
                )
            list_price = on_demand.get(name)
            if spec.sold_on_demand and list_price is not None:
                out.append(
                    Offer(**shape, zone=zone, market=Market.ON_DEMAND, usd_per_hour=list_price)
                )
    return out


def _fabric(spec: GpuType) -> dict[str, Any]:
    """The type's EFA as DescribeInstanceTypes says (EfaSupported, EfaInfo's interface count);
    the hardware table's count where a cached listing predates the count."""
    if not spec.efa:
        return {"fabric": Fabric.NONE, "fabric_interfaces": 0}
    known = hardware.aws_fabric(spec.instance_type)
    interfaces = spec.efa_interfaces or known.interfaces or 1
    return {"fabric": Fabric.EFA, "fabric_interfaces": interfaces}
