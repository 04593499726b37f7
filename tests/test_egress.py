"""What moving a job's state costs (policies/egress.py): the rates per path from the
bundled tables, where a region is, the restore's time, storage at rest, and residency."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from policies import egress
from policies.egress import (
    OTHER_CLOUD,
    OTHER_CONTINENT,
    SAME_CONTINENT,
    SAME_REGION,
    Place,
    RateTableError,
    StatePlace,
    continent_of,
    move_cost,
    residency_problem,
    storage_usd_per_gb_month,
    transfer_usd_per_gb,
)


@pytest.fixture
def overrides() -> Iterator[None]:
    try:
        yield
    finally:
        egress.override(None)


@pytest.mark.parametrize(
    ("src", "dst", "usd", "path"),
    [
        (("aws", "us-east-1"), ("aws", "us-east-1"), 0.0, SAME_REGION),
        (("aws", "us-east-1"), ("aws", "us-west-2"), 0.02, SAME_CONTINENT),
        (("aws", "eu-central-1"), ("aws", "eu-west-1"), 0.02, SAME_CONTINENT),
        (("aws", "eu-central-1"), ("aws", "us-east-1"), 0.08, OTHER_CONTINENT),
        (("aws", "eu-central-1"), ("gcp", "europe-west3"), 0.09, OTHER_CLOUD),
        (("gcp", "europe-west4"), ("gcp", "europe-west4"), 0.0, SAME_REGION),
        (("gcp", "europe-west4"), ("gcp", "europe-west1"), 0.02, SAME_CONTINENT),
        (("gcp", "us-central1"), ("gcp", "asia-east1"), 0.08, OTHER_CONTINENT),
        (("gcp", "us-central1"), ("aws", "us-east-1"), 0.12, OTHER_CLOUD),
        # The local cloud: the rates of the cloud whose region name it borrows.
        (("local", "us-east-1"), ("local", "us-east-1"), 0.0, SAME_REGION),
        (("local", "us-east-1"), ("local", "eu-west-1"), 0.08, OTHER_CONTINENT),
        (("local", "europe-west4"), ("local", "europe-west1"), 0.02, SAME_CONTINENT),
        (("local", "europe-west4"), ("aws", "eu-west-1"), 0.12, OTHER_CLOUD),
        (("local", "eu-west-1"), ("gcp", "europe-west4"), 0.09, OTHER_CLOUD),
    ],
)
def test_a_transfer_is_priced_by_the_source_cloud_and_its_path(
    src: tuple[str, str], dst: tuple[str, str], usd: float, path: str
) -> None:
    rate = transfer_usd_per_gb(*src, *dst)
    assert (rate.usd_per_gb, rate.path) == (usd, path)
    assert rate.source  # every figure says where it comes from
    if src[0] == "local":
        assert rate.source.startswith("simulated")


def test_every_bundled_row_has_a_source_and_a_date() -> None:
    for (provider, path), rate in egress.egress_table().items():
        assert "as of 20" in rate.source, (provider, path)
    for key, found in egress.storage_table().items():
        assert "as of 20" in found.source, key


@pytest.mark.parametrize(
    ("provider", "region", "continent"),
    [
        ("aws", "us-east-1", "north-america"),  # the region table
        ("gcp", "northamerica-northeast1", "north-america"),
        ("aws", "eu-central-2", "europe"),
        ("aws", "ap-southeast-2", "oceania"),
        ("local", "europe-west4", "europe"),  # borrowed from GCP
        ("aws", "us-gov-west-1", "north-america"),  # not in the table: by its prefix
        ("aws", "eu-future-9", "europe"),
        ("gcp", "southamerica-west9", "south-america"),
        ("aws", "me-west-7", "middle-east"),
        ("gcp", "eu", "europe"),  # GCS multi-regions and dual-regions
        ("gcp", "us", "north-america"),
        ("gcp", "asia", "asia"),
        ("gcp", "eur4", "europe"),
        ("gcp", "nam4", "north-america"),
        ("aws", "moon-base-1", None),
    ],
)
def test_a_region_is_placed_by_the_region_table_else_by_its_name(
    provider: str, region: str, continent: str | None
) -> None:
    assert continent_of(provider, region) == continent


def test_a_new_region_is_placed_by_its_prefix_and_an_unknown_one_priced_dearest() -> None:
    assert transfer_usd_per_gb("aws", "eu-future-9", "aws", "eu-west-1").usd_per_gb == 0.02
    rate = transfer_usd_per_gb("aws", "moon-base-1", "aws", "us-east-1")
    assert (rate.usd_per_gb, rate.path) == (0.08, OTHER_CONTINENT)
    assert "aws moon-base-1: place unknown" in rate.source
    # A multi-region reading into a region of its continent is no same-region read.
    assert transfer_usd_per_gb("gcp", "eu", "gcp", "europe-west4").path == SAME_CONTINENT
    assert transfer_usd_per_gb("gcp", "us", "gcp", "europe-west4").path == OTHER_CONTINENT


def test_a_provider_without_rates_is_priced_at_the_dearest_listed() -> None:
    rate = transfer_usd_per_gb("toy", "toy-1", "aws", "us-east-1")
    assert (rate.usd_per_gb, rate.path) == (0.12, OTHER_CLOUD)
    assert "no rates for provider toy" in rate.source
    assert storage_usd_per_gb_month("toy", "toy-1") == 0.023


def test_move_cost_is_egress_plus_the_restore_at_the_new_price() -> None:
    # 100 GB from AWS Frankfurt to GCP Iowa at 100 MiB/s on a $36/h instance:
    # egress 100 GB x $0.09 = $9.00; restore 1e11 B / 2^20 / 100 = 953.67 s; at $36/h $9.54.
    cost = move_cost(
        10**11,
        Place("aws", "eu-central-1"),
        ("gcp", "us-central1"),
        restore_mib_s=100.0,
        price_per_hour=36.0,
    )
    assert cost.path == OTHER_CLOUD
    assert cost.egress_usd == pytest.approx(9.0)
    assert cost.restore_s == pytest.approx(953.674, abs=1e-3)
    assert cost.restore_usd == pytest.approx(9.53674, abs=1e-5)
    assert cost.total_usd == pytest.approx(18.53674, abs=1e-5)


def test_without_a_measured_throughput_a_restore_is_one_flow_halved_between_regions() -> None:
    # 5 Gbps = 625 MB/s in one region: 5e11 B in 800 s; 2.5 Gbps across regions: 1600 s.
    here = move_cost(5 * 10**11, ("aws", "eu-central-1"), ("aws", "eu-central-1"), price_per_hour=9)
    assert (here.egress_usd, here.path) == (0.0, SAME_REGION)
    assert here.restore_s == pytest.approx(800.0)
    assert here.restore_usd == pytest.approx(2.0)
    away = move_cost(5 * 10**11, ("aws", "eu-central-1"), ("aws", "us-east-1"), price_per_hour=9)
    assert away.restore_s == pytest.approx(1600.0)
    assert away.egress_usd == pytest.approx(40.0)  # 500 GB x $0.08


def test_bad_move_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="size_bytes"):
        move_cost(-1, ("aws", "a"), ("aws", "a"), price_per_hour=1)
    with pytest.raises(ValueError, match="restore_mib_s"):
        move_cost(1, ("aws", "a"), ("aws", "a"), restore_mib_s=-5, price_per_hour=1)
    with pytest.raises(ValueError, match="price_per_hour"):
        move_cost(1, ("aws", "a"), ("aws", "a"), price_per_hour=float("nan"))
    with pytest.raises(ValueError, match="horizon_hours"):
        StatePlace("aws", "us-east-1", 1, horizon_hours=0)


def test_the_explanation_names_size_place_egress_and_restore() -> None:
    # 12.3 GiB from Frankfurt to Virginia at 300 MiB/s on a $10/h instance:
    # 13,207,024,435 B x $0.08/GB = $1.06; 12,595 MiB / 300 = 42 s; at $10/h $0.12.
    state = StatePlace("aws", "eu-central-1", int(12.3 * 2**30), restore_mib_s=300.0)
    cost = state.move("aws", "us-east-1", 10.0)
    assert state.explain(cost) == (
        "moving 12.3 GiB from aws eu-central-1: $1.06 egress + 42 s restore ($0.12)"
    )


@pytest.mark.parametrize(
    ("provider", "region", "usd"),
    [
        ("aws", "us-east-1", 0.023),
        ("aws", "eu-central-1", 0.023),
        ("gcp", "us-central1", 0.020),
        ("gcp", "europe-west1", 0.020),
        ("gcp", "europe-west3", 0.023),
        ("gcp", "asia-east1", 0.023),  # not listed: the provider's upper end
        ("local", "us-east-1", 0.0),
        ("aws", None, 0.023),
    ],
)
def test_storage_rates_by_provider_and_region(
    provider: str, region: str | None, usd: float
) -> None:
    assert storage_usd_per_gb_month(provider, region) == usd


def test_a_daemon_setting_overrides_a_rate_and_bad_ones_are_named(overrides: None) -> None:
    egress.override({"aws": {"other-continent": 0.02}})
    rate = transfer_usd_per_gb("aws", "eu-central-1", "aws", "us-east-1")
    assert rate.usd_per_gb == 0.02 and "daemon setting" in rate.source
    assert transfer_usd_per_gb("gcp", "us-central1", "gcp", "asia-east1").usd_per_gb == 0.08
    with pytest.raises(RateTableError, match=r"egress_usd_per_gb\.aws\.sideways: unknown path"):
        egress.override({"aws": {"sideways": 0.1}})
    with pytest.raises(RateTableError, match=r"egress_usd_per_gb\.azure: unknown provider"):
        egress.override({"azure": {"same-region": 0.0}})
    with pytest.raises(RateTableError, match="not between 0 and 100"):
        egress.override({"aws": {"same-region": -1}})
    egress.override(None)
    assert transfer_usd_per_gb("aws", "eu-central-1", "aws", "us-east-1").usd_per_gb == 0.08


def test_a_malformed_table_is_named_by_line() -> None:
    header = "provider,path,usd_per_gb,as_of,source,note\n"
    with pytest.raises(RateTableError, match=r"t\.csv:2: path 'sideways'"):
        egress.parse_egress(header + "aws,sideways,0.1,2026-01,x,\n", origin="t.csv")
    with pytest.raises(RateTableError, match=r"t\.csv:3: aws same-region repeated"):
        egress.parse_egress(
            header + "aws,same-region,0,2026-01,x,\naws,same-region,0,2026-01,x,\n", origin="t.csv"
        )
    with pytest.raises(RateTableError, match=r"t\.csv:2: usd_per_gb 'lots'"):
        egress.parse_egress(header + "aws,same-region,lots,2026-01,x,\n", origin="t.csv")
    with pytest.raises(RateTableError, match="header"):
        egress.parse_storage("provider,usd\n", origin="s.csv")


@pytest.mark.parametrize(
    ("compliance", "provider", "region", "problem"),
    [
        (None, "aws", "us-east-1", None),
        ("eu", "aws", "eu-central-1", None),
        ("gdpr", "gcp", "europe-west4", None),
        ("eu", "local", "eu-west-1", None),
        ("gdpr", "aws", "us-east-1", "us-east-1 is in US (Northern Virginia), outside the EU/EEA"),
        ("eu", "aws", "eu-west-2", "eu-west-2 is in GB (London), outside the EU/EEA"),
        ("eu", "gcp", "eu", None),  # the EU multi-region keeps data in EU member states
        ("eu", "gcp", "us", "multi-region us keeps data outside the EU/EEA"),
        ("us", "gcp", "us", None),
        ("eu", "aws", "moon-base-1", "unknown jurisdiction"),
    ],
)
def test_residency_reads_the_one_region_table(
    compliance: str | None, provider: str, region: str, problem: str | None
) -> None:
    found = residency_problem(compliance, provider, region)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_the_daemon_setting_is_checked_when_the_config_is_read(overrides: None) -> None:
    from pydantic import ValidationError

    from optimizer.daemon.config import ConfigSchema

    good = ConfigSchema.model_validate(
        {"data_transfer": {"egress_usd_per_gb": {"gcp": {"other-cloud": 0.085}}}}
    )
    good.data_transfer.apply()
    assert transfer_usd_per_gb("gcp", "us-central1", "aws", "us-east-1").usd_per_gb == 0.085
    with pytest.raises(ValidationError, match=r"egress_usd_per_gb\.gcp\.nowhere: unknown path"):
        ConfigSchema.model_validate(
            {"data_transfer": {"egress_usd_per_gb": {"gcp": {"nowhere": 0.1}}}}
        )
    ConfigSchema().data_transfer.apply()  # no setting: the bundled table
    assert transfer_usd_per_gb("gcp", "us-central1", "aws", "us-east-1").usd_per_gb == 0.12
