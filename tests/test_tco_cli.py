"""`gpuopt tco` end to end in-process: a fixed catalog and assumptions file in, the table,
the JSON, the chart and the located errors out (the model's arithmetic: tests/test_tco.py)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.cli.tco_history import from_groups
from tests.helpers.gcp import A2_COMMITMENT_SKUS, DATA

HEADER = (
    "provider,region,zone,instance_type,gpu_model,gpu_count,gpu_memory_gib,vcpus,ram_gib,"
    "interconnect,market,usd_per_hour,observed_at,source,term_years,payment_option,upfront_usd"
)
ROWS = [
    "aws,us-east-1,,p5.48xlarge,H100-80GB,8,80,192,2048,nvlink,on_demand,40.0,2026-11-01T00:00:00Z,t,,,",
    "aws,us-east-1,use1-az1,p5.48xlarge,H100-80GB,8,80,192,2048,nvlink,spot,16.0,2026-11-01T00:00:00Z,t,,,",
    "aws,us-east-1,,p5.48xlarge,H100-80GB,8,80,192,2048,nvlink,committed,28.0,2026-11-01T00:00:00Z,t,1,no_upfront,",
    "aws,us-east-1,,p5.48xlarge,H100-80GB,8,80,192,2048,nvlink,committed,18.0,2026-11-01T00:00:00Z,t,3,all_upfront,473040",
    # dearer, in the EU: what a GDPR policy is left with
    "aws,eu-central-1,,p5.48xlarge,H100-80GB,8,80,192,2048,nvlink,on_demand,50.0,2026-11-01T00:00:00Z,t,,,",
]
ASSUMPTIONS = textwrap.dedent(
    """\
    spot: {overhead_fraction: 0.10, on_demand_share: 0.20}
    on_prem:
      server_usd: 200000
      pue: 1.5
      usd_per_kwh: 0.10
      ops_fraction_per_year: 0.10
    """
)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    catalog = tmp_path / "prices.csv"
    catalog.write_text("\n".join([HEADER, *ROWS]) + "\n")
    assumptions = tmp_path / "tco.yaml"
    assumptions.write_text(ASSUMPTIONS)
    return catalog, assumptions


def run(*args: str) -> object:
    return CliRunner().invoke(app, ["tco", *args])


def test_json_has_every_option_its_totals_and_the_sources(files: tuple[Path, Path]) -> None:
    catalog, assumptions = files
    out = run(
        "--gpu",
        "h100",
        "--gpus",
        "8",
        "--hours-per-month",
        "500",
        "--years",
        "3",
        "--catalog",
        str(catalog),
        "--assumptions",
        str(assumptions),
        "--json",
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    totals = {o["name"]: o["total_usd"] for o in data["options"]}
    assert totals == {
        "on-demand": 720_000.0,
        "spot": 397_440.0,
        "committed 1y no upfront": 735_840.0,
        "committed 3y all upfront": 473_040.0,
        "spot + committed": 397_440.0,
        "on-premises": 291_340.52,
    }
    assert data["cheapest"] == "on-premises"
    # the file's values say so; the rest keep their default's source
    assert data["assumptions"]["on_prem.pue"] == {
        "value": 1.5,
        "source": "the assumptions file",
        "confidence": "yours",
    }
    assert "Uptime Institute" not in data["assumptions"]["on_prem.pue"]["source"]
    assert "EIA" not in data["assumptions"]["on_prem.usd_per_kwh"]["source"]
    assert data["assumptions"]["on_prem.host_power_w"]["confidence"] == "secondary"
    crossings = {(b["a"], b["b"]): b["hours_per_month"] for b in data["break_evens"]}
    assert crossings[("on-demand", "committed 3y all upfront")] == 328.5


def test_table_names_the_cheapest_and_the_break_evens(files: tuple[Path, Path]) -> None:
    catalog, assumptions = files
    out = run(
        "--gpu",
        "H100-80GB",
        "--hours-per-month",
        "500",
        "--catalog",
        str(catalog),
        "--assumptions",
        str(assumptions),
    )
    assert out.exit_code == 0, out.output
    assert "on-premises *" in out.output
    assert "$291,341" in out.output
    assert "on-demand = committed 3y all upfront at 328 h/month" in out.output
    assert "on-premises is cheapest at 500 h/month" in out.output
    assert "* the cheapest option at 500 h/month" in out.output  # the mark explained


def test_the_snapshots_note_is_printed_once_and_a_tie_is_said(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path))
    out = run("--gpu", "H100", "--gpus", "8", "--hours-per-month", "300")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert text.count("the snapshot has no committed rows for aws or gcp") == 1
    # All spot in the mix ties with spot: said, and the runner-up is the next that costs more.
    assert "spot is cheapest at 300 h/month" in text and "(spot + committed ties with it)" in text


def test_policy_chooses_the_capacity_where_it_allows(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    catalog, assumptions = files
    policy = tmp_path / "eu.yaml"
    policy.write_text(
        textwrap.dedent(
            """\
            apiVersion: gpuopt/v1
            kind: Policy
            name: eu-only
            workload: {type: training, gpus: 8, gpu_memory_gib: 60}
            markets: [spot]
            placement: {compliance: gdpr}
            budget: {monthly_usd: 10}
            """
        )
    )
    out = run(
        "--gpu",
        "H100-80GB",
        "--hours-per-month",
        "100",
        "--years",
        "1",
        "--catalog",
        str(catalog),
        "--assumptions",
        str(assumptions),
        "--policy",
        str(policy),
        "--json",
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    options = {o["name"]: o for o in data["options"]}
    # only eu-central-1 passes: on-demand there, everything else estimated from it
    assert options["on-demand"]["where"] == "1x p5.48xlarge (aws eu-central-1)"
    assert options["on-demand"]["total_usd"] == 50.0 * 100 * 12
    assert "estimated" in " ".join(options["spot"]["notes"])
    assert data["policy"] == "eu-only"


def test_bad_assumptions_name_file_line_and_field(files: tuple[Path, Path], tmp_path: Path) -> None:
    catalog, _ = files
    bad = tmp_path / "bad.yaml"
    bad.write_text("on_prem:\n  pue: 0.5\n  wattage: 3\n")
    out = run(
        "--gpu",
        "H100-80GB",
        "--hours-per-month",
        "10",
        "--catalog",
        str(catalog),
        "--assumptions",
        str(bad),
    )
    assert out.exit_code == 2
    assert f"{bad}:2:" in out.output and "on_prem.pue" in out.output
    assert f"{bad}:3:" in out.output and "wattage" in out.output
    assert "Traceback" not in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "H900"], "unknown GPU model 'H900'"),
        (["--gpu", "H100-80GB"], "--hours-per-month: give the usage"),
        (["--gpu", "H100-80GB", "--hours-per-month", "1", "--chart", "x.gif"], "write a .svg"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = run(*args)
    assert out.exit_code == 2
    assert message in out.output


def test_chart_writes_cumulative_cost_per_option(files: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the chart extra (matplotlib) is not installed")
    catalog, assumptions = files
    chart = tmp_path / "tco.svg"
    out = run(
        "--gpu",
        "H100-80GB",
        "--hours-per-month",
        "500",
        "--catalog",
        str(catalog),
        "--assumptions",
        str(assumptions),
        "--chart",
        str(chart),
    )
    assert out.exit_code == 0, out.output
    svg = chart.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for label in ("on-premises ($291,341)", "committed 3y all upfront ($473,040)"):
        assert label in svg


def test_history_reads_the_spot_overhead_and_the_usage() -> None:
    by_market = [
        {"group": "on_demand", "billed_seconds": 36_000, "overhead_seconds": 0},
        {"group": "spot", "billed_seconds": 396_000, "overhead_seconds": 36_000},
    ]
    by_month = [
        {"group": "2026-09", "billed_seconds": 0},
        {"group": "2026-10", "billed_seconds": 300 * 3600},
        {"group": "2026-11", "billed_seconds": 100 * 3600},
    ]
    found = from_groups(by_market, by_month)
    assert found.overhead_fraction == pytest.approx(36_000 / 360_000)  # 10%
    assert found.hours_per_month == pytest.approx(200)  # months with billed hours only
    empty = from_groups([], [])
    assert empty.overhead_fraction is None and empty.hours_per_month is None


# --- live commitment rates: the GCP adapter against the fake Billing and Compute APIs -----


@pytest.fixture
def gcp_fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """The environment pointing `gpuopt tco --provider gcp` at the fake, us-central1 only,
    whose catalog holds the A2 commitment SKUs of both terms (tests/helpers/gcp.py)."""
    pytest.importorskip("google.cloud.compute_v1")
    from tests.helpers.gcp_fake import COMPUTE_SERVICE_ID, FakeGcp

    with FakeGcp.from_recorded(DATA) as fake:
        fake.skus[COMPUTE_SERVICE_ID].extend(A2_COMMITMENT_SKUS)
        monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.setenv("GPUOPT_GCP_PROJECT", "gpuopt-test")
        monkeypatch.setenv("GPUOPT_GCP_REGIONS", "us-central1")
        monkeypatch.setenv("GPUOPT_GCP_COMPUTE_ENDPOINT", fake.url)
        monkeypatch.setenv("GPUOPT_GCP_BILLING_ENDPOINT", fake.url)
        yield fake


def test_tco_with_gcp_prices_commitments_at_the_catalogs_rates(gcp_fake: Any) -> None:
    out = run(
        "--provider", "gcp", "--gpu", "A100-40GB", "--gpus", "8", "--hours-per-month", "500",
        "--years", "3", "--json",
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    options = {o["name"]: o for o in data["options"]}
    # 8 GPUs: one a2-highgpu-8g or eight a2-highgpu-1g, the same per GPU-hour.
    # 1 year: 96 x 0.019915 + 680 x 0.002669 + 8 x 1.848362 = 18.513656 $/h, 3 terms of 8,760 h
    one = options["committed 1y no upfront"]
    assert one["total_usd"] == pytest.approx(18.513656 * 8760 * 3)  # 486,538.88
    # 3 years: 8 x (12 x 0.014225 + 85 x 0.001907 + 1.0285) = 10.89036 $/h, 26,280 h
    three = options["committed 3y no upfront"]
    assert three["total_usd"] == pytest.approx(10.89036 * 26_280)  # 286,198.66
    for option in (one, three):
        assert not any("estimated" in note for note in option["notes"])
    assert not any("no committed offer" in note for note in data["notes"])


def test_tco_with_gcp_estimates_a_term_no_sku_prices_and_says_so(gcp_fake: Any) -> None:
    out = run(
        "--provider", "gcp", "--gpu", "L4", "--gpus", "1", "--hours-per-month", "200", "--json"
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert any(note.startswith("no committed offer for L4 from gcp:") for note in data["notes"]), (
        data["notes"]
    )
    one = next(o for o in data["options"] if o["name"].startswith("committed 1y"))
    assert any("estimated" in note for note in one["notes"])
