"""The region table and jurisdiction checks: GDPR keeps work inside the EU/EEA."""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from policies.regions import (
    COMPLIANCE_PRESETS,
    CONTINENTS,
    CountryCodeError,
    RegionTableError,
    UnknownPresetError,
    all_regions,
    check,
    lookup,
    parse_table,
    providers,
    reload,
    resolve_preset,
    table_text,
    validate_countries,
)

EU_REGIONS = [
    ("aws", "eu-west-1"),  # Ireland
    ("aws", "eu-central-1"),  # Frankfurt
    ("aws", "eu-north-1"),  # Stockholm
    ("aws", "eu-south-1"),  # Milan
    ("aws", "eu-west-3"),  # Paris
    ("aws", "eu-south-2"),  # Aragon, Spain
    ("gcp", "europe-west3"),  # Frankfurt
    ("gcp", "europe-north2"),  # Stockholm
    ("gcp", "europe-north1"),  # Hamina
    ("gcp", "europe-west4"),  # Netherlands
    ("gcp", "europe-west1"),  # Belgium
    ("gcp", "europe-west8"),  # Milan
    ("gcp", "europe-west9"),  # Paris
    ("gcp", "europe-southwest1"),  # Madrid
    ("gcp", "europe-central2"),  # Warsaw
]
NON_EU_REGIONS = [
    ("aws", "eu-west-2", "GB"),  # London
    ("gcp", "europe-west2", "GB"),  # London
    ("aws", "eu-central-2", "CH"),  # Zurich
    ("gcp", "europe-west6", "CH"),  # Zurich
    ("aws", "il-central-1", "IL"),  # Tel Aviv
    ("gcp", "me-west1", "IL"),  # Tel Aviv
    ("gcp", "me-central1", "QA"),  # Doha
    ("gcp", "me-central2", "SA"),  # Dammam
    ("aws", "us-east-1", "US"),
]
TRAPS = {
    ("aws", "eu-west-2"): "GB",
    ("gcp", "europe-west2"): "GB",
    ("gcp", "europe-west6"): "CH",
    ("aws", "eu-central-2"): "CH",
    ("gcp", "me-west1"): "IL",
    ("aws", "il-central-1"): "IL",
    ("gcp", "me-central1"): "QA",
    ("gcp", "me-central2"): "SA",
    ("gcp", "europe-north2"): "SE",
    ("gcp", "europe-north1"): "FI",
    ("aws", "eu-south-2"): "ES",
}


@pytest.mark.parametrize(("provider", "region"), EU_REGIONS)
def test_gdpr_policy_accepts_eu_regions(provider: str, region: str) -> None:
    assert check(provider, region, compliance="eu") is None


@pytest.mark.parametrize(("provider", "region", "country"), NON_EU_REGIONS)
def test_gdpr_policy_rejects_regions_outside_the_eea(
    provider: str, region: str, country: str
) -> None:
    reason = check(provider, region, compliance="eu")
    assert reason is not None
    assert reason.startswith(f"{region} is in {country} (")
    assert reason.endswith("outside the EU/EEA")


def test_gdpr_policy_rejects_london_with_a_readable_reason() -> None:
    assert check("aws", "eu-west-2", compliance="gdpr") == (
        "eu-west-2 is in GB (London), outside the EU/EEA"
    )


def test_eea_member_outside_the_eu_passes_the_eu_preset() -> None:
    norway = [r for r in all_regions() if r.country == "NO"]
    if not norway:
        pytest.skip("no AWS or GCP region in Norway (an EEA, non-EU state) is in the table")
    for region in norway:
        assert region.eea and not region.eu
        assert check(region.provider, region.name, compliance="eu") is None


@pytest.mark.parametrize(("provider", "region"), [("aws", "eu-west-9"), ("gcp", "europe-west99")])
def test_unknown_region_fails_closed_under_a_preset(provider: str, region: str) -> None:
    reason = check(provider, region, compliance="eu")
    assert reason is not None and reason.startswith("unknown jurisdiction")


def test_unknown_region_fails_closed_under_a_countries_list() -> None:
    reason = check("gcp", "europe-west99", countries=["DE"])
    assert reason is not None and reason.startswith("unknown jurisdiction")


def test_unknown_provider_fails_closed_under_a_preset() -> None:
    reason = check("azure", "westeurope", compliance="eu")
    assert reason is not None and reason.startswith("unknown jurisdiction")


def test_without_a_rule_any_region_passes() -> None:
    assert check("aws", "eu-west-2", compliance=None) is None
    assert check("gcp", "europe-west99", compliance=None) is None
    assert check("azure", "westeurope") is None


def test_gdpr_is_an_alias_of_eu() -> None:
    assert resolve_preset("gdpr") == "eu"
    assert resolve_preset(" GDPR ") == "eu"
    assert check("gcp", "europe-west6", compliance="gdpr") == check(
        "gcp", "europe-west6", compliance="eu"
    )
    assert check("gcp", "europe-west4", compliance="gdpr") is None


@pytest.mark.parametrize(
    ("preset", "allowed", "rejected"),
    [
        ("us", ("gcp", "us-central1"), ("aws", "ca-central-1")),
        ("uk", ("aws", "eu-west-2"), ("aws", "eu-west-1")),
        ("ch", ("gcp", "europe-west6"), ("gcp", "europe-west3")),
    ],
)
def test_single_country_presets(
    preset: str, allowed: tuple[str, str], rejected: tuple[str, str]
) -> None:
    assert check(*allowed, compliance=preset) is None
    reason = check(*rejected, compliance=preset)
    assert reason is not None and f"outside {COMPLIANCE_PRESETS[preset].label}" in reason


def test_unknown_preset_raises_and_lists_the_valid_names() -> None:
    with pytest.raises(UnknownPresetError) as caught:
        resolve_preset("hipaa")
    message = str(caught.value)
    assert "'hipaa'" in message
    for name in ("eu", "gdpr", "us", "uk", "ch"):
        assert name in message
    with pytest.raises(ValueError, match="unknown compliance preset"):
        check("aws", "eu-west-1", compliance="europe")


def test_countries_filter_keeps_only_listed_countries() -> None:
    assert check("aws", "eu-central-1", countries=["de", "FR"]) is None
    assert check("gcp", "europe-west9", countries=["DE", "fr"]) is None
    reason = check("gcp", "europe-west4", countries=["DE", "FR"])
    assert reason == "europe-west4 is in NL (Eemshaven), not in the allowed countries (DE, FR)"


def test_countries_filter_and_preset_both_apply() -> None:
    # Switzerland is named in the list but the EU preset still rules it out.
    assert check("gcp", "europe-west6", compliance="eu", countries=["CH", "DE"]) is not None
    assert check("gcp", "europe-west3", compliance="eu", countries=["CH", "DE"]) is None
    assert check("gcp", "europe-west4", compliance="eu", countries=["CH", "DE"]) is not None


def test_validate_countries_normalizes_and_drops_repeats() -> None:
    assert validate_countries([" de", "FR", "De"]) == ["DE", "FR"]
    assert validate_countries([]) == []


@pytest.mark.parametrize("bad", ["DEU", "D", "", "1A", "Ü1", "UK", "EL"])
def test_validate_countries_names_the_bad_code(bad: str) -> None:
    with pytest.raises(CountryCodeError) as caught:
        validate_countries(["DE", bad])
    assert repr(bad) in str(caught.value)


def test_countries_given_as_a_bare_string_are_refused() -> None:
    with pytest.raises(ValueError, match="list of codes"):
        validate_countries("DE")


def test_check_validates_the_countries_list() -> None:
    with pytest.raises(ValueError, match="'GER'"):
        check("aws", "eu-central-1", countries=["GER"])


@pytest.mark.parametrize(("key", "country"), sorted(TRAPS.items()))
def test_trap_regions_sit_in_the_right_country(key: tuple[str, str], country: str) -> None:
    region = lookup(*key)
    assert region is not None
    assert region.country == country
    assert region.eu == (country in {"SE", "FI", "ES"})


def test_lookup_ignores_case_and_returns_none_for_unknown() -> None:
    region = lookup("AWS", "EU-West-1")
    assert region is not None and (region.provider, region.name) == ("aws", "eu-west-1")
    assert region.location == "Dublin" and region.eu and region.eea
    assert lookup("aws", "eu-west-9") is None
    assert lookup("azure", "westeurope") is None


def test_all_regions_filters_by_provider() -> None:
    aws, gcp = all_regions("aws"), all_regions("gcp")
    assert {r.provider for r in aws} == {"aws"}
    assert {r.provider for r in gcp} == {"gcp"}
    assert len(aws) + len(gcp) == len(all_regions())
    assert all_regions("azure") == []


def test_table_covers_the_regions_named_in_the_brief() -> None:
    aws = {r.name for r in all_regions("aws")}
    gcp = {r.name for r in all_regions("gcp")}
    assert {"ca-west-1", "mx-central-1", "ap-east-2", "ap-southeast-7", "eu-south-2"} <= aws
    assert {"europe-west12", "europe-north2", "northamerica-south1", "africa-south1"} <= gcp


def test_every_row_has_a_source_and_valid_fields() -> None:
    for region in all_regions():
        assert region.source.startswith("https://"), region
        assert region.continent in CONTINENTS, region
        assert region.location, region
        # EEA membership is implied by EU membership.
        assert region.eea or not region.eu, region


def test_region_names_are_unique_per_provider_in_the_data_file() -> None:
    rows = csv.DictReader(
        io.StringIO("\n".join(x for x in table_text().splitlines() if not x.startswith("#")))
    )
    counts = Counter((row["provider"], row["name"]) for row in rows)
    assert [key for key, n in counts.items() if n > 1] == []
    assert len(counts) == len(all_regions())


HEADER = "provider,name,location,country,continent,source\n"
ROW = "aws,eu-west-1,Dublin,IE,europe,https://example.com/regions\n"


def test_parse_table_rejects_a_repeated_region() -> None:
    with pytest.raises(RegionTableError, match=r"t\.csv:3: aws region eu-west-1 repeated"):
        parse_table(HEADER + ROW + ROW, origin="t.csv")


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("aws,eu-west-1,Dublin,ie,europe,https://x\n", "country 'ie'"),
        ("aws,eu-west-1,Dublin,IE,eurasia,https://x\n", "continent 'eurasia'"),
        ("Azure Cloud,westeurope,Amsterdam,NL,europe,https://x\n", "provider 'Azure Cloud'"),
        ("local,eu-west-1,Dublin,IE,europe,https://x\n", "local borrows"),
        ("aws,eu-west-1,Dublin,IE,europe,\n", "all 6 fields"),
        ("aws,eu-west-1,Dublin,IE,europe,http://x\n", "not an https URL"),
    ],
)
def test_parse_table_names_the_bad_line(row: str, fragment: str) -> None:
    with pytest.raises(RegionTableError, match=r"t\.csv:3: ") as caught:
        parse_table("# comment\n" + HEADER + row, origin="t.csv")
    assert fragment in str(caught.value)


def test_a_new_providers_rows_make_its_regions_known_and_installing_it_makes_it_nameable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new provider's rows in regions.csv make its regions known and checked for
    jurisdiction; a policy may name it once it is installed (the provider registry)."""
    from policies.loader import parse_policy
    from providers import registry
    from providers.base import ProviderDisabled, ProviderSettings
    from providers.registry import Capabilities, ProviderEntry

    def no_build(settings: ProviderSettings) -> Any:
        raise ProviderDisabled("not here", provider="acme")

    text = "apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {gpus: 1}\n"
    named = text + "placement: {providers: [acme], compliance: eu}\n"
    installed = " or ".join(
        [", ".join(repr(n) for n in registry.names()[:-1]), repr(registry.names()[-1])]
    )
    rows = "acme,fr-par-1,Paris,FR,europe,https://example.com/acme/regions\n"
    monkeypatch.setattr("policies.regions.table_text", lambda: HEADER + rows + ROW)
    reload()
    try:
        assert providers() == ("acme", "aws", "local", "ssh")
        assert check("acme", "fr-par-1", compliance="eu") is None
        assert check("acme", "fr-par-2", compliance="eu") is not None  # not in the table
        with pytest.raises(ValueError, match=f"must be an installed provider: {installed}"):
            parse_policy(named)
        with registry.registered(ProviderEntry("acme", Capabilities(), no_build)):
            assert parse_policy(named).placement.providers == ["acme"]
            assert "acme" in parse_policy(text).placement.providers  # default: every provider
        with pytest.raises(ValueError, match="must be an installed provider"):
            parse_policy(named)
    finally:
        monkeypatch.undo()
        reload()
    assert providers() == ("aws", "gcp", "local", "ssh")


@pytest.mark.catalog
def test_every_catalog_region_is_known(shared_catalog_dir: Path) -> None:
    files = {"aws": "aws_gpu_vms.csv", "gcp": "gcp_gpu_vms.csv"}
    missing: list[str] = []
    for provider, filename in files.items():
        path = shared_catalog_dir / filename
        if not path.is_file():
            pytest.skip(f"{path} not found")
        with path.open(encoding="utf-8", newline="") as stream:
            names = {row["Region"] for row in csv.DictReader(stream)}
        assert names, f"{path} has no Region values"
        missing += [f"{provider}:{n}" for n in sorted(names) if lookup(provider, n) is None]
    assert missing == []
