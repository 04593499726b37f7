"""Every table fits the width it is given (optimizer/cli/render.py): with COLUMNS at 80 and
120 no line of `offers`, `offers --policy`, `costs`, `local list`, `probes list` and `tco` is
wider, every price is printed whole, and `-o wide` (or `--wide`) shows every header. The
offers come from the bundled snapshot; `costs` and `probes list` read a loopback server
answering as the daemon does; `local list` reads a local cloud's state directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from typer.testing import CliRunner

from optimizer.cli import app
from providers.local.state import InstanceRecord, StateDir

pytestmark = pytest.mark.usefixtures("daemon_env")

WIDTHS = [80, 120]
POLICY = """apiVersion: gpuopt/v1
kind: Policy
name: cheap
workload: {gpus: 1, gpu_memory_gib: 16}
markets: [spot, on_demand]
"""


def run(*args: str, columns: int | None, env: dict[str, str] | None = None) -> list[str]:
    given = dict(env or {}) | ({} if columns is None else {"COLUMNS": str(columns)})
    done = CliRunner().invoke(app, list(args), env=given)
    assert done.exit_code == 0, done.output
    return done.stdout.splitlines()


gpuopt = run


def fits(lines: list[str], width: int) -> None:
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, too_wide


@pytest.fixture
def no_daemon(tmp_path: Path) -> dict[str, str]:
    """No token anywhere: `offers --policy` ranks here, saying so on stderr."""
    return {"GPUOPT_DATA_DIR": str(tmp_path / "data")}


@pytest.mark.parametrize("width", WIDTHS)
def test_offers_fit_with_every_price_whole(width: int, no_daemon: dict[str, str]) -> None:
    def gpuopt(*args: str, columns: int | None) -> list[str]:
        return run(*args, columns=columns, env=no_daemon)

    lines = gpuopt("offers", "--limit", "15", columns=width)
    fits(lines, width)
    offers = json.loads("\n".join(gpuopt("offers", "--limit", "15", "--json", columns=width)))
    text = "\n".join(lines)
    for o in offers:
        assert f"{o['usd_per_hour']:.4f}" in text and o["instance_type"] in text
    wide = gpuopt("offers", "--limit", "15", "-o", "wide", columns=width)
    assert wide[1].split() == [
        "provider", "region", "zone", "instance", "type", "GPU", "GPUs", "GiB/GPU", "vCPUs",
        "RAM", "GiB", "link", "market", "$/h", "$/GPU-h",
    ]  # fmt: skip
    assert gpuopt("offers", "--limit", "15", "--wide", columns=width) == wide
    assert gpuopt("offers", "--limit", "15", columns=None) == wide  # piped, no COLUMNS: wide


@pytest.mark.parametrize("width", WIDTHS)
def test_a_policys_ranking_fits_and_keeps_the_score_whole(
    width: int, tmp_path: Path, no_daemon: dict[str, str]
) -> None:
    policy = tmp_path / "cheap.yaml"
    policy.write_text(POLICY)
    args = ("offers", "--policy", str(policy), "--limit", "8", "--explain")
    lines = gpuopt(*args, columns=width, env=no_daemon)
    fits(lines, width)
    ranked = json.loads("\n".join(gpuopt(*args, "--json", columns=width, env=no_daemon)))
    header = lines[1].split()
    assert header[:2] == ["#", "provider"] and "$/h" in header
    text = "\n".join(lines)
    for c in ranked["candidates"]:
        assert f"{c['offer']['usd_per_hour']:.4f}" in text
        assert f"{c['score']:.4f}" in text  # the column it is ranked by stays
    assert "rejected offers, by the first rule they failed" in text
    wide = gpuopt(*args, "-o", "wide", columns=width, env=no_daemon)
    for name in ("zone", "GiB/GPU", "headroom", "$/GPU-h", "figures", "examples"):
        assert any(name in [cell.strip() for cell in line.split("  ")] for line in wide), name
    assert not any(line.endswith("shows all)") for line in wide)


COST_GROUP = {
    "spend_usd": 1234.5678,
    "storage_usd": 3.21,
    "network_usd": 0.0,
    "total_usd": 1237.7778,
    "on_demand_usd": 4321.0,
    "savings_usd": 3086.4322,
    "savings_fraction": 0.714,
    "net_savings_fraction": 0.69,
    "billed_seconds": 36000.0,
    "overhead_seconds": 900.0,
    "overhead_usd": 30.5,
    "baseline_known": True,
    "attempt_count": 3,
}
COST_HEADERS = [
    "spend", "storage", "on-demand", "saved", "saved %", "net %", "billed h", "overhead h",
    "overhead", "attempts",
]  # fmt: skip


@pytest.mark.parametrize("width", WIDTHS)
def test_costs_fit_with_every_amount_whole(httpserver: HTTPServer, width: int) -> None:
    groups = [
        {**COST_GROUP, "group": "a-rather-long-training-job-name"},
        {**COST_GROUP, "group": "eval", "spend_usd": 7.5, "savings_usd": 1.25},
    ]
    httpserver.expect_request("/costs").respond_with_json(groups)
    env = {"GPUOPT_API_TOKEN": "tok"}
    api = ("--api", httpserver.url_for(""))
    lines = gpuopt("costs", *api, columns=width, env=env)
    fits(lines, width)
    text = "\n".join(lines)
    for amount in ("1,234.57", "4,321.00", "3,086.43", "7.50", "1.25", "1,242.07"):
        assert amount in text, amount
    assert "a-rather-long-training-job-name" in text
    assert any(line.startswith("total ") for line in lines)
    wide = gpuopt("costs", *api, "-o", "wide", columns=width, env=env)
    header = wide[1]
    assert all(name in header for name in COST_HEADERS)
    assert gpuopt("costs", *api, "--wide", columns=width, env=env) == wide
    as_json = gpuopt("costs", *api, "-o", "json", columns=width, env=env)
    assert json.loads("\n".join(as_json)) == groups


PROBE = {
    "id": 1,
    "at": "2026-12-04T22:10:00Z",
    "provider": "aws",
    "region": "us-east-1",
    "zone": "us-east-1a",
    "instance_type": "p4de.24xlarge",
    "gpu_model": "A100-80GB",
    "gpu_count": 8,
    "status": "pass",
    "tflops": {"bf16": 280.512},
    "copy_gbps": 1650.25,
    "job": "train-resnet-50-nightly",
    "simulated": False,
}


@pytest.mark.parametrize("width", WIDTHS)
def test_probes_list_fits(httpserver: HTTPServer, width: int) -> None:
    found = [PROBE, {**PROBE, "id": 2, "job": "host", "simulated": True, "zone": None}]
    httpserver.expect_request("/probes").respond_with_json({"probes": found})
    env = {"GPUOPT_API_TOKEN": "tok"}
    api = ("--api", httpserver.url_for(""))
    lines = gpuopt("probes", "list", *api, columns=width, env=env)
    fits(lines, width)
    assert lines[0].split()[:4] == ["AT", "INSTANCE", "TYPE", "STATUS"] or width == 120
    assert "train-resnet-50-nightly" in lines[1] and lines[2].endswith("host (simulated)")
    wide = gpuopt("probes", "list", *api, "--wide", columns=width, env=env)
    assert wide[0].split() == [
        "AT", "PROVIDER", "INSTANCE", "TYPE", "ZONE", "STATUS", "BF16/GPU", "COPY/GPU", "JOB",
    ]  # fmt: skip
    assert "280.5 TFLOPS" in wide[1] and "1,650.2 GB/s" in wide[1]


@pytest.mark.parametrize("width", WIDTHS)
def test_local_list_fits(tmp_path: Path, width: int) -> None:
    state = StateDir(tmp_path / "local-cloud")
    state.ensure()
    for n, (market, price) in enumerate((("spot", 12.3456), ("on_demand", 40.9657)), start=1):
        state.save(
            InstanceRecord(
                id=f"i-local-000{n}",
                key=f"7-{n}",
                region="us-local-1",
                zone="us-local-1a",
                instance_type="p4de.24xlarge",
                market=market,
                usd_per_hour=price,
                launched_at=0.0,
                job="train-resnet-50-nightly",
                attempt=n,
                state="terminated",
                end_reason="user",
                detail="terminated by gpuopt after the job's checkpoint "
                "upload finished and its agent reported the exit",
                ended_at=60.0,
            )
        )
    env = {"GPUOPT_DATA_DIR": str(tmp_path)}
    lines = gpuopt("local", "list", "--all", columns=width, env=env)
    fits(lines, width)
    text = "\n".join(lines)
    assert "12.3456 sim" in text and "40.9657" in text
    assert "train-resnet-50-nightly #1" in text and "train-resnet-50-nightly #2" in text
    wide = gpuopt("local", "list", "--all", "-o", "wide", columns=width, env=env)
    assert wide[0].split() == [
        "INSTANCE",
        "STATE",
        "TYPE",
        "ZONE",
        "MARKET",
        "$/h",
        "JOB",
        "DETAIL",
    ]
    assert wide[1].endswith("its agent reported the exit")


@pytest.mark.parametrize("width", WIDTHS)
def test_tco_fits(width: int) -> None:
    args = ("tco", "--gpu", "H100", "--hours-per-month", "300")
    lines = gpuopt(*args, columns=width)
    fits(lines, width)
    result = json.loads("\n".join(gpuopt(*args, "--json", columns=width)))
    text = "\n".join(lines)
    for option in result["options"]:
        assert f"${option['total_usd']:,.0f}" in text
    wide = gpuopt(*args, "-o", "wide", columns=width)
    header = next(line for line in wide if line.startswith("option"))
    for name in ("where", "total", "per month", "$/GPU-h used", "fixed", "notes"):
        assert name in header


def test_cost_rows_and_totals_round_alike() -> None:
    """Amounts under a dollar get four decimals in every row and the total, so rows read
    0.0040 and 0.0042 beside a 0.0082 total, not 0.00 and 0.00 beside 0.01."""
    from optimizer.cli.tables import usd_digits

    small = [{"spend_usd": 0.004}, {"spend_usd": 0.0042}]
    assert usd_digits([*small, {"spend_usd": 0.0082}]) == 4
    assert usd_digits([{"spend_usd": 12.5, "storage_usd": 0.0}, {"spend_usd": 3.0}]) == 2
    assert usd_digits([{"spend_usd": 0.0}]) == 2
