"""What moving a job's state costs: data transfer out, restore time, and storage at rest (pure).

The rates are list prices in two tables bundled with the package, each row with its source
and date (`policies/egress_rates.csv`, `policies/storage_rates.csv`), read once.
They are never live figures; `override` replaces rates (the daemon's
`data_transfer.egress_usd_per_gb` setting, where given).

A transfer is priced by the cloud the data leaves, by its path:
- `same-region`: the object store and the instance in one region (free on AWS and GCP);
- `same-continent`: another region of the same continent group;
- `other-continent`: a region of another continent group, or one whose place is unknown
  (priced as the dearest inter-region path, so an unknown region is never a cheap move);
- `other-cloud`: another provider (the internet rate, first tier).

Where a region is lies in the one region table (`policies.regions`: AWS and GCP regions with
their country and continent), which the compliance rules read too. A name it does not know
is placed by its prefix (`us-`/`northamerica-` -> north-america, `eu-`/`europe-` -> europe,
...), and GCS multi- and dual-regions (`eu`, `us`, `asia`, `eur4`, `nam4`) by their name.

The local cloud borrows AWS and GCP region names: it is charged the rates of the cloud whose
name it borrows, labelled simulated (rows `local-aws`, `local-gcp`), so that a demo on it
shows the same gravity a real cloud would. Its own store costs nothing at rest.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Final

from optimizer.common.units import size_text
from policies import regions

EGRESS_RESOURCE: Final = "egress_rates.csv"
STORAGE_RESOURCE: Final = "storage_rates.csv"

SAME_REGION: Final = "same-region"
OTHER_ZONE: Final = "other-zone"
SAME_CONTINENT: Final = "same-continent"
OTHER_CONTINENT: Final = "other-continent"
OTHER_CLOUD: Final = "other-cloud"
PATHS: Final = (SAME_REGION, OTHER_ZONE, SAME_CONTINENT, OTHER_CONTINENT, OTHER_CLOUD)

GB: Final = 1e9  # clouds bill transfer and storage per decimal GB
GIB: Final = float(1 << 30)
HOURS_PER_MONTH: Final = 730.0  # the clouds' billing month for GB-month prices
MIB: Final = float(1 << 20)

# Restore throughput when nothing was measured: one TCP flow to S3 carries about 5 Gbps, and
# traffic between regions is limited to about half an instance's bandwidth (AWS S3
# performance guidelines; EC2 instance network bandwidth docs). 5 Gbps = 596 MiB/s.
SINGLE_FLOW_MIB_S: Final = 5e9 / 8 / MIB
CROSS_REGION_FACTOR: Final = 0.5
RESTORE_SOURCE: Final = (
    "assumed: ~5 Gbps single flow to object storage, halved between regions "
    "(AWS S3 performance guidelines; EC2 network bandwidth docs)"
)


class RateTableError(ValueError):
    """A rate table (bundled or an override) that cannot be used; names the line or key."""


@dataclass(frozen=True, slots=True)
class Rate:
    """USD per GB over one path, and where the figure comes from."""

    usd_per_gb: float
    path: str  # one of PATHS
    source: str


@dataclass(frozen=True, slots=True)
class StorageRate:
    usd_per_gb_month: float
    source: str


@dataclass(frozen=True, slots=True)
class Place:
    """Where data sits or goes: a provider and one of its regions (or a GCS multi-region)."""

    provider: str
    region: str

    def __str__(self) -> str:
        return f"{self.provider} {self.region}"


@dataclass(frozen=True, slots=True)
class MoveCost:
    """What moving `size_bytes` of state to an instance costs before the job does work."""

    egress_usd: float
    restore_s: float
    restore_usd: float  # the restore's seconds at the new instance's price
    total_usd: float
    path: str


def default_restore_mib_s(path: str) -> float:
    """The restore throughput assumed when none was measured (`RESTORE_SOURCE`)."""
    if path == SAME_REGION:
        return SINGLE_FLOW_MIB_S
    return SINGLE_FLOW_MIB_S * CROSS_REGION_FACTOR


# --- tables -------------------------------------------------------------------------------


def _rows(text: str, origin: str, header: list[str]) -> list[tuple[int, dict[str, str]]]:
    lines = [
        (n, line)
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.startswith("#")
    ]
    reader = csv.DictReader(io.StringIO("\n".join(line for _, line in lines)))
    if reader.fieldnames != header:
        raise RateTableError(f"{origin}: header {reader.fieldnames} != {header}")
    out = []
    for index, row in enumerate(reader, 1):
        where = f"{origin}:{lines[index][0]}"
        if None in row or any(row[k] is None or not row[k].strip() for k in header[:-1]):
            raise RateTableError(f"{where}: every row needs {', '.join(header[:-1])}")
        out.append((lines[index][0], row))
    return out


def _usd(text: str, where: str, field: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RateTableError(f"{where}: {field} {text!r} is not a number") from None
    if not (math.isfinite(value) and 0 <= value <= 100):
        raise RateTableError(f"{where}: {field} {text!r} is not between 0 and 100")
    return value


def parse_egress(text: str, *, origin: str = EGRESS_RESOURCE) -> dict[tuple[str, str], Rate]:
    """(table provider, path) -> Rate from the egress table's CSV text."""
    header = ["provider", "path", "usd_per_gb", "as_of", "source", "note"]
    out: dict[tuple[str, str], Rate] = {}
    for line, row in _rows(text, origin, header):
        where = f"{origin}:{line}"
        if row["path"] not in PATHS:
            raise RateTableError(f"{where}: path {row['path']!r} not in {PATHS}")
        key = (row["provider"], row["path"])
        if key in out:
            raise RateTableError(f"{where}: {key[0]} {key[1]} repeated")
        value = _usd(row["usd_per_gb"], where, "usd_per_gb")
        out[key] = Rate(value, row["path"], f"{row['source']} (as of {row['as_of']})")
    return out


def parse_storage(
    text: str, *, origin: str = STORAGE_RESOURCE
) -> dict[tuple[str, str], StorageRate]:
    """(provider, region or "*") -> StorageRate from the storage table's CSV text."""
    header = ["provider", "region", "usd_per_gb_month", "as_of", "source", "note"]
    out: dict[tuple[str, str], StorageRate] = {}
    for line, row in _rows(text, origin, header):
        where = f"{origin}:{line}"
        key = (row["provider"], row["region"])
        if key in out:
            raise RateTableError(f"{where}: {key[0]} {key[1]} repeated")
        value = _usd(row["usd_per_gb_month"], where, "usd_per_gb_month")
        out[key] = StorageRate(value, f"{row['source']} (as of {row['as_of']})")
    return out


def _text(name: str) -> str:
    return (resources.files("policies") / name).read_text(encoding="utf-8")


_OVERRIDES: dict[tuple[str, str], float] = {}


@cache
def egress_table() -> dict[tuple[str, str], Rate]:
    """The bundled egress table with the overrides in force, read once."""
    table = parse_egress(_text(EGRESS_RESOURCE))
    for key, value in _OVERRIDES.items():
        table[key] = Rate(value, key[1], "daemon setting data_transfer.egress_usd_per_gb")
    return table


@cache
def storage_table() -> dict[tuple[str, str], StorageRate]:
    """The bundled storage table, read once."""
    return parse_storage(_text(STORAGE_RESOURCE))


def override(rates: Mapping[str, Mapping[str, float]] | None) -> None:
    """Replace egress rates: `{provider: {path: usd_per_gb}}` (the daemon setting); None or
    empty puts the bundled table back. A provider or path the table does not have, or a
    rate that is not a number from 0 to 100, raises naming it (`check_overrides`)."""
    checked = check_overrides(rates)
    _OVERRIDES.clear()
    _OVERRIDES.update(checked)
    egress_table.cache_clear()


def check_overrides(
    rates: Mapping[str, Mapping[str, float]] | None,
) -> dict[tuple[str, str], float]:
    """The overrides as (provider, path) -> USD/GB; raises RateTableError naming a provider
    or path the table does not have, or a rate that is not a number from 0 to 100."""
    checked: dict[tuple[str, str], float] = {}
    bundled = parse_egress(_text(EGRESS_RESOURCE))
    for provider, paths in (rates or {}).items():
        if not any(p == provider for p, _ in bundled):
            known = sorted({p for p, _ in bundled})
            raise RateTableError(
                f"data_transfer.egress_usd_per_gb.{provider}: unknown provider; known: "
                + ", ".join(known)
            )
        for path, value in paths.items():
            where = f"data_transfer.egress_usd_per_gb.{provider}.{path}"
            if path not in PATHS:
                raise RateTableError(f"{where}: unknown path; paths: {', '.join(PATHS)}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RateTableError(f"{where}: {value!r} is not a number")
            checked[(provider, path)] = _usd(str(value), where, "rate")
    return checked


# --- where a region is ------------------------------------------------------------------

# Region-name prefixes, for names the region table does not hold (a new region). The
# clouds' own naming: AWS `us-east-1`, GCP `northamerica-northeast1`.
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("northamerica-", "north-america"),
    ("southamerica-", "south-america"),
    ("us-", "north-america"),
    ("ca-", "north-america"),
    ("mx-", "north-america"),
    ("sa-", "south-america"),
    ("europe-", "europe"),
    ("eu-", "europe"),
    ("me-", "middle-east"),
    ("il-", "middle-east"),
    ("af-", "africa"),
    ("africa-", "africa"),
    ("australia-", "oceania"),
    ("ap-southeast-2", "oceania"),
    ("ap-southeast-4", "oceania"),
    ("ap-", "asia"),
    ("asia-", "asia"),
)
# GCS multi-regions and predefined dual-regions: a location, not one region.
_MULTI: dict[str, str] = {"us": "north-america", "eu": "europe", "asia": "asia"}
_DUAL = re.compile(r"^(nam|eur|asia)\d+$")
_DUAL_CONTINENT = {"nam": "north-america", "eur": "europe", "asia": "asia"}
# The countries a GCS multi-region keeps data in (cloud.google.com/storage/docs/locations:
# "eu": data centers in EU member states; "us": in the United States).
_MULTI_COUNTRIES: dict[str, frozenset[str]] = {
    "eu": regions.EU_COUNTRIES,
    "us": frozenset({"US"}),
}


def is_multi_region(region: str) -> bool:
    """Whether a location names several regions (a GCS multi- or dual-region)."""
    name = region.strip().lower()
    return name in _MULTI or bool(_DUAL.match(name))


def continent_of(provider: str, region: str) -> str | None:
    """The region's continent group (`policies.regions.CONTINENTS`), or None where neither
    the region table nor the name says."""
    found = regions.lookup(provider, region)
    if found is not None:
        return found.continent
    name = region.strip().lower()
    if name in _MULTI:
        return _MULTI[name]
    dual = _DUAL.match(name)
    if dual:
        return _DUAL_CONTINENT[dual.group(1)]
    for prefix, continent in _PREFIXES:
        if name.startswith(prefix):
            return continent
    return None


def _table_provider(provider: str, region: str) -> str:
    """The egress table's row group for a provider: the local cloud's by the borrowed name."""
    if provider != "local":
        return provider
    found = regions.lookup(provider, region)
    owner = found.provider if found is not None else None
    if owner is None:
        name = region.strip().lower()
        owner = "gcp" if re.match(r"^[a-z]+-[a-z]+\d+$", name) or is_multi_region(name) else "aws"
    return f"local-{owner}"


def path_of(src_provider: str, src_region: str, dst_provider: str, dst_region: str) -> str:
    """Which path data takes from one place to another (module docstring)."""
    if src_provider.strip().lower() != dst_provider.strip().lower():
        return OTHER_CLOUD
    a, b = src_region.strip().lower(), dst_region.strip().lower()
    if a == b:
        return SAME_REGION
    here = continent_of(src_provider, a)
    there = continent_of(dst_provider, b)
    if here is not None and here == there:
        return SAME_CONTINENT
    return OTHER_CONTINENT


def transfer_usd_per_gb(
    src_provider: str, src_region: str, dst_provider: str, dst_region: str
) -> Rate:
    """USD per GB to move data from (src_provider, src_region) to (dst_provider,
    dst_region), priced by the source cloud; the path and the figure's source with it.
    A provider without rows is priced at the dearest rate listed for the path."""
    provider = src_provider.strip().lower()
    path = path_of(provider, src_region, dst_provider, dst_region)
    group = _table_provider(provider, src_region)
    found = egress_table().get((group, path))
    if found is None:
        # A provider the table has no rows for (a plug-in's): the dearest listed rate for the
        # path, so its moves are never priced below what they may cost.
        dearest = max(rate.usd_per_gb for (_, p), rate in egress_table().items() if p == path)
        return Rate(dearest, path, f"no rates for provider {provider}: the dearest listed")
    unknown = [
        f"{p} {r}"
        for p, r in ((src_provider, src_region), (dst_provider, dst_region))
        if path == OTHER_CONTINENT and continent_of(p, r) is None
    ]
    if unknown:
        where = " and ".join(unknown)
        return Rate(found.usd_per_gb, path, f"{where}: place unknown, priced as {path}")
    return found


def egress_by_path(provider: str, region: str, size_bytes: int) -> dict[str, float]:
    """What moving `size_bytes` out of (provider, region) costs in egress along each path
    that leaves the region (same continent, other continent, other cloud), USD, from the
    same table the ranking reads."""
    group = _table_provider(provider.strip().lower(), region)
    out = {}
    for path in (SAME_CONTINENT, OTHER_CONTINENT, OTHER_CLOUD):
        found = egress_table().get((group, path))
        if found is not None:
            out[path] = size_bytes / GB * found.usd_per_gb
    return out


def move_cost(
    size_bytes: int,
    src: Place | tuple[str, str],
    dst: Place | tuple[str, str],
    *,
    restore_mib_s: float | None = None,
    price_per_hour: float,
) -> MoveCost:
    """What moving `size_bytes` from `src` to an instance at `dst` that costs
    `price_per_hour` takes: the transfer out of `src`'s cloud, and the restore's seconds
    (at `restore_mib_s`, else the assumed throughput of the path) paid at the new price."""
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    if price_per_hour < 0 or not math.isfinite(price_per_hour):
        raise ValueError(f"price_per_hour must be a finite number >= 0, got {price_per_hour}")
    sp, sr = src if isinstance(src, tuple) else (src.provider, src.region)
    dp, dr = dst if isinstance(dst, tuple) else (dst.provider, dst.region)
    rate = transfer_usd_per_gb(sp, sr, dp, dr)
    throughput = restore_mib_s if restore_mib_s else default_restore_mib_s(rate.path)
    if throughput <= 0 or not math.isfinite(throughput):
        raise ValueError(f"restore_mib_s must be a finite number > 0, got {restore_mib_s}")
    egress = size_bytes / GB * rate.usd_per_gb
    seconds = size_bytes / MIB / throughput
    restore = seconds * price_per_hour / 3600
    return MoveCost(egress, seconds, restore, egress + restore, rate.path)


def storage_rate(provider: str, region: str | None) -> StorageRate:
    """USD per GB-month at rest, Standard class, with its source: the region's row, else
    the provider's `*` row; a provider without rows, the dearest rate listed."""
    table = storage_table()
    key = provider.strip().lower()
    name = (region or "").strip().lower()
    found = table.get((key, name)) or table.get((key, "*"))
    if found is None:
        dearest = max(rate.usd_per_gb_month for rate in table.values())
        return StorageRate(dearest, f"no rates for provider {key}: the dearest listed")
    return found


def storage_usd_per_gb_month(provider: str, region: str | None) -> float:
    """USD per GB-month at rest (`storage_rate`)."""
    return storage_rate(provider, region).usd_per_gb_month


def residency_problem(compliance: str | None, provider: str, region: str) -> str | None:
    """Why state kept at (provider, region) breaks the compliance preset (`eu`/`gdpr`, `us`,
    ...), or None where it does not (or no preset is given). The region table's check
    decides (`policies.regions.check`, the same the placement rules use); a GCS multi-region
    passes where every country it may keep data in is inside the preset."""
    if compliance is None:
        return None
    preset = regions.COMPLIANCE_PRESETS[regions.resolve_preset(compliance)]
    name = region.strip().lower()
    if provider.strip().lower() in ("gcp", "local") and name in _MULTI:
        countries = _MULTI_COUNTRIES.get(name)
        if countries is not None and countries <= preset.countries:
            return None
        return f"multi-region {name} keeps data outside {preset.label}"
    return regions.check(provider, region, compliance=compliance)


# --- the job's state, as the ranking reads it --------------------------------------------

DEFAULT_HORIZON_HOURS: Final = 24.0
"""The run a move is spread over when the job says nothing of its length (no max_duration):
a day. A move's one-off cost is added to an offer's hourly price as move_usd / horizon."""


@dataclass(frozen=True, slots=True)
class StatePlace:
    """Where a job's state (its newest checkpoint) is and how big it is, as the ranking of a
    launch for that job reads it. `restore_mib_s`: the throughput a restore of this job
    measured (None: `default_restore_mib_s`); `horizon_hours`: how long the next attempt is
    expected to run, over which a move's cost is spread."""

    provider: str
    region: str
    size_bytes: int
    restore_mib_s: float | None = None
    horizon_hours: float = DEFAULT_HORIZON_HOURS

    def __post_init__(self) -> None:
        if self.size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {self.size_bytes}")
        if self.restore_mib_s is not None and not (
            math.isfinite(self.restore_mib_s) and self.restore_mib_s > 0
        ):
            raise ValueError(f"restore_mib_s must be > 0, got {self.restore_mib_s}")
        if not (math.isfinite(self.horizon_hours) and self.horizon_hours > 0):
            raise ValueError(f"horizon_hours must be > 0, got {self.horizon_hours}")

    @property
    def place(self) -> Place:
        return Place(self.provider, self.region)

    def move(self, provider: str, region: str, price_per_hour: float) -> MoveCost:
        """The move of this state to an instance at (provider, region)."""
        return move_cost(
            self.size_bytes,
            self.place,
            (provider, region),
            restore_mib_s=self.restore_mib_s,
            price_per_hour=price_per_hour,
        )

    def explain(self, cost: MoveCost) -> str:
        """`moving 12.3 GiB from aws eu-central-1: $0.25 egress + 41 s restore ($0.03)`."""
        return (
            f"moving {size_text(int(self.size_bytes))} from {self.place}: "
            f"${cost.egress_usd:.2f} egress + {cost.restore_s:.0f} s restore "
            f"(${cost.restore_usd:.2f})"
        )
