"""Where each cloud region is, and whether a jurisdiction rule allows it.

The table lives in `regions.csv` next to this module (one row per region, each with the cloud's
public regions page as its source) and is read once. EU and EEA membership derive from the
country, so a region's flags cannot disagree with where it is. The providers a policy may
name are the table's (plus the local cloud, which borrows their region names): a new
provider's rows here are all the policies need of it.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

TABLE_RESOURCE = "regions.csv"
PROVIDER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")  # as providers/registry.py spells one

# Continents as this project groups regions. The Gulf states and Israel get their own group
# because that is how both clouds name those regions (me-*), and Europe is a geographic group:
# it holds London and Zurich, so it is never a stand-in for "the EU".
CONTINENTS = (
    "europe",
    "north-america",
    "south-america",
    "asia",
    "oceania",
    "africa",
    "middle-east",
)

# The 27 EU member states, ISO 3166-1 alpha-2 (Greece is GR here; the EU itself writes EL).
# Source: https://european-union.europa.eu/principles-countries-history/eu-countries_en
EU_COUNTRIES = frozenset(
    "AT BE BG CY CZ DE DK EE ES FI FR GR HR HU IE IT LT LU LV MT NL PL PT RO SE SI SK".split()  # noqa: SIM905
)
# The EEA is the EU plus Iceland, Liechtenstein and Norway (not Switzerland, not the UK).
# Source: https://www.efta.int/eea/eea-agreement
EEA_COUNTRIES = EU_COUNTRIES | {"IS", "LI", "NO"}

# Codes people write that ISO 3166-1 does not assign to the country they mean.
_NOT_ISO = {"UK": "GB", "EL": "GR"}


class RegionTableError(ValueError):
    """The bundled region table is malformed (names the line)."""


class UnknownPresetError(ValueError):
    """A compliance preset name that is not defined."""


class CountryCodeError(ValueError):
    """A country code that is not two letters (ISO 3166-1 alpha-2)."""


@dataclass(frozen=True)
class Region:
    """One cloud region and its jurisdiction."""

    provider: str
    name: str  # as the cloud spells it
    location: str
    country: str  # ISO 3166-1 alpha-2, upper case
    continent: str  # one of CONTINENTS
    eu: bool
    eea: bool
    source: str  # the public page the row was taken from


@dataclass(frozen=True)
class Preset:
    """A named jurisdiction rule: the countries a region must be in."""

    name: str
    label: str  # completes "outside ..." in a rejection reason
    countries: frozenset[str]


COMPLIANCE_PRESETS: dict[str, Preset] = {
    # GDPR covers the whole EEA, so EEA states count as inside.
    "eu": Preset("eu", "the EU/EEA", EEA_COUNTRIES),
    "us": Preset("us", "the US", frozenset({"US"})),
    "uk": Preset("uk", "the UK", frozenset({"GB"})),
    "ch": Preset("ch", "Switzerland", frozenset({"CH"})),
}
PRESET_ALIASES = {"gdpr": "eu"}


def parse_table(text: str, *, origin: str = TABLE_RESOURCE) -> list[Region]:
    """Regions from the table's CSV text; blank lines and lines starting with `#` are skipped."""
    lines = [
        (n, line)
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.startswith("#")
    ]
    reader = csv.DictReader(io.StringIO("\n".join(line for _, line in lines)))
    expected = ["provider", "name", "location", "country", "continent", "source"]
    if reader.fieldnames != expected:
        raise RegionTableError(f"{origin}: header {reader.fieldnames} != {expected}")
    regions: list[Region] = []
    seen: set[tuple[str, str]] = set()
    for index, row in enumerate(reader, 1):
        where = f"{origin}:{lines[index][0]}"
        if None in row or any(v is None or not v.strip() for v in row.values()):
            raise RegionTableError(f"{where}: every row needs all {len(expected)} fields")
        region = _region(row, where)
        key = (region.provider, region.name)
        if key in seen:
            raise RegionTableError(f"{where}: {region.provider} region {region.name} repeated")
        seen.add(key)
        regions.append(region)
    return regions


def _region(row: dict[str, str], where: str) -> Region:
    provider, country, continent = row["provider"], row["country"], row["continent"]
    if not PROVIDER_NAME.match(provider):
        raise RegionTableError(
            f"{where}: provider {provider!r} is not a provider name (lowercase letters, digits, -)"
        )
    if provider in BORROWED_NAMES:
        raise RegionTableError(f"{where}: provider {provider} borrows other providers' regions")
    if not (len(country) == 2 and country.isascii() and country.isalpha() and country.isupper()):
        raise RegionTableError(f"{where}: country {country!r} is not an upper-case alpha-2 code")
    if continent not in CONTINENTS:
        raise RegionTableError(f"{where}: continent {continent!r} not in {CONTINENTS}")
    if not row["source"].startswith("https://"):
        raise RegionTableError(f"{where}: source {row['source']!r} is not an https URL")
    return Region(
        provider=provider,
        name=row["name"],
        location=row["location"],
        country=country,
        continent=continent,
        eu=country in EU_COUNTRIES,
        eea=country in EEA_COUNTRIES,
        source=row["source"],
    )


def table_text() -> str:
    """The bundled table's raw CSV text."""
    return (resources.files(__package__) / TABLE_RESOURCE).read_text(encoding="utf-8")


@cache
def _index() -> dict[tuple[str, str], Region]:
    return {(r.provider, r.name): r for r in parse_table(table_text())}


def reload() -> None:
    """Forget the table read so far; the next lookup reads `table_text()` again."""
    _index.cache_clear()


# The local cloud borrows AWS and GCP region names (its offers copy the snapshot's rows), so
# its regions sit where the cloud that owns the name puts them. Owned machines (`ssh`) do the
# same: each says the cloud region nearest it (a Frankfurt rack is eu-central-1), so the
# compliance presets and egress rates place it with no table of its own. The two clouds'
# names do not collide (eu-west-1 vs europe-west1); AWS is tried first all the same.
BORROWED_NAMES = {"local": ("aws", "gcp"), "ssh": ("aws", "gcp")}


def providers() -> tuple[str, ...]:
    """The providers a policy may name: the table's, in table order, then the borrowers."""
    named = dict.fromkeys(provider for provider, _ in _index())
    return (*named, *(b for b in BORROWED_NAMES if b not in named))


def lookup(provider: str, region: str) -> Region | None:
    """The region's row, or None when the table does not know it."""
    key = provider.strip().lower()
    name = region.strip().lower()
    for owner in BORROWED_NAMES.get(key, (key,)):
        found = _index().get((owner, name))
        if found is not None:
            return found
    return None


def all_regions(provider: str | None = None) -> list[Region]:
    """Every known region, in table order; only one provider's when `provider` is given."""
    wanted = None if provider is None else provider.strip().lower()
    return [r for r in _index().values() if wanted is None or r.provider == wanted]


def resolve_preset(name: str) -> str:
    """The canonical preset name for `name` or an alias of it (case-insensitive)."""
    key = name.strip().lower()
    key = PRESET_ALIASES.get(key, key)
    if key not in COMPLIANCE_PRESETS:
        valid = ", ".join(sorted([*COMPLIANCE_PRESETS, *PRESET_ALIASES]))
        raise UnknownPresetError(f"unknown compliance preset {name!r}; valid presets: {valid}")
    return key


def validate_countries(codes: Iterable[str]) -> list[str]:
    """The codes upper-cased, duplicates dropped; raises CountryCodeError naming a bad one."""
    if isinstance(codes, str):
        # A bare "DE" would otherwise be read as the codes "D" and "E".
        raise CountryCodeError(f"countries must be a list of codes, not the string {codes!r}")
    cleaned: list[str] = []
    for code in codes:
        value = code.strip().upper() if isinstance(code, str) else ""
        if not (len(value) == 2 and value.isascii() and value.isalpha()):
            raise CountryCodeError(
                f"bad country code {code!r}: expected two letters (ISO 3166-1 alpha-2)"
            )
        if value in _NOT_ISO:
            raise CountryCodeError(
                f"bad country code {code!r}: not ISO 3166-1; write {_NOT_ISO[value]!r}"
            )
        if value not in cleaned:
            cleaned.append(value)
    return cleaned


def check(
    provider: str,
    region: str,
    *,
    compliance: str | None = None,
    countries: Sequence[str] = (),
) -> str | None:
    """None when the region is allowed, else a short reason.

    A preset and a countries list both apply when both are given. With either one, a region the
    table does not know is rejected (its jurisdiction cannot be shown); with neither, every
    region is allowed.
    """
    preset = COMPLIANCE_PRESETS[resolve_preset(compliance)] if compliance is not None else None
    allowed = validate_countries(countries)
    if preset is None and not allowed:
        return None
    found = lookup(provider, region)
    if found is None:
        return f"unknown jurisdiction: {provider} region {region!r} is not in the region table"
    where = f"{found.name} is in {found.country} ({found.location})"
    if preset is not None and found.country not in preset.countries:
        return f"{where}, outside {preset.label}"
    if allowed and found.country not in allowed:
        return f"{where}, not in the allowed countries ({', '.join(allowed)})"
    return None
