"""`gpuopt tco --from-history` against a real daemon's API on loopback: the spot overhead and
the usage come from the ledger (`GET /costs` by market and by month) over attempts written to
its store, all of them or one policy's, and change the comparison as docs/tco.md says."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.model import Market
from tests.helpers import TOKEN, make_config, running
from tests.helpers.costs import attempt, observe

pytestmark = pytest.mark.usefixtures("daemon_env")

MARCH = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
APRIL = datetime(2026, 4, 7, 8, 0, tzinfo=UTC)
NOW = datetime(2026, 5, 2, tzinfo=UTC)
CATALOG = textwrap.dedent(
    """\
    provider,region,zone,instance_type,gpu_model,gpu_count,gpu_memory_gib,vcpus,ram_gib,interconnect,market,usd_per_hour,observed_at,source
    aws,us-east-1,,p5.48xlarge,H100-80GB,8,80,192,2048,nvlink,on_demand,40.0,2026-11-01T00:00:00Z,t
    aws,us-east-1,use1-az1,p5.48xlarge,H100-80GB,8,80,192,2048,nvlink,spot,16.0,2026-11-01T00:00:00Z,t
    """
)
POLICY = textwrap.dedent(
    """\
    apiVersion: gpuopt/v1
    kind: Policy
    name: team
    workload: {type: training, gpus: 8, gpu_memory_gib: 60}
    """
)


def ran(launched: datetime, hours: float, overhead_minutes: float) -> dict[str, Any]:
    """An attempt gpuopt ended after `hours`, whose job started `overhead_minutes` in."""
    end = launched + timedelta(hours=hours)
    return {
        "launched": launched,
        "job_started": launched + timedelta(minutes=overhead_minutes),
        "ended_at": end,
        "state": "ended",
        "instance_gone": True,
        "terminated_at": end,
        "terminated_by": "gpuopt",
    }


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """The ledger: policy team ran spot 11 h in March and 10 h in April, 30 minutes of each
    before its job started (1 h of 21 h billed did no work: 1/20 = 5% overhead on the useful
    hours, 10.5 h a month); policy night ran on-demand 5 h in March."""
    with running(make_config(tmp_path), clock=ManualClock(NOW)) as d:
        store = d.store
        observe(store, MARCH - timedelta(days=1), 0.40)
        observe(store, MARCH - timedelta(days=1), 1.00, market=Market.ON_DEMAND)
        attempt(store, "train", 1, **ran(MARCH, 11, 30))
        attempt(store, "train", 2, **ran(APRIL, 10, 30))
        attempt(
            store,
            "serve",
            policy="night",
            market=Market.ON_DEMAND,
            zone=None,
            usd_per_hour=1.00,
            **ran(MARCH + timedelta(days=2), 5, 0),
        )
        yield d


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    catalog, policy = tmp_path / "prices.csv", tmp_path / "team.yaml"
    catalog.write_text(CATALOG)
    policy.write_text(POLICY)
    return catalog, policy


def tco(daemon: Daemon, catalog: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        app,
        ["tco", "--gpu", "H100-80GB", "--gpus", "8", "--years", "3", "--from-history",
         "--catalog", str(catalog), "--api", daemon.url, "--json", *args],
        env={"GPUOPT_API_TOKEN": TOKEN},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_policys_ledger_sets_the_spot_overhead_and_the_usage(
    daemon: Daemon, files: tuple[Path, Path]
) -> None:
    catalog, policy = files
    data = tco(daemon, catalog, "--policy", str(policy))
    assert data["policy"] == "team"
    assert data["hours_per_month"] == pytest.approx(10.5)  # (11 + 10) / 2 months
    assert data["assumptions"]["spot.overhead_fraction"]["value"] == pytest.approx(0.05)
    said = (
        "spot overhead 5.0% from the ledger: 1.0 h billed without a job running for 20.0 h of "
        "work (21.0 spot hours billed in all)"
    )
    assert said in data["notes"]
    totals = {o["name"]: o["total_usd"] for o in data["options"]}
    # spot: (0.8 x 16 x 1.05 + 0.2 x 40) = 21.44 $/h, x 10.5 h x 36 months
    assert totals["spot"] == pytest.approx(21.44 * 10.5 * 36)  # 8,104.32
    assert totals["on-demand"] == pytest.approx(40 * 10.5 * 36)  # 15,120


def test_without_a_policy_every_line_counts_and_hours_given_win(
    daemon: Daemon, files: tuple[Path, Path]
) -> None:
    catalog, _ = files
    every = tco(daemon, catalog)
    # March 11 + 5 h, April 10 h: 13 h a month; the on-demand hours carry no spot overhead
    assert every["hours_per_month"] == pytest.approx(13.0)
    assert every["assumptions"]["spot.overhead_fraction"]["value"] == pytest.approx(0.05)
    stated = tco(daemon, catalog, "--hours-per-month", "200")
    assert stated["hours_per_month"] == 200.0
    assert stated["assumptions"]["spot.overhead_fraction"]["value"] == pytest.approx(0.05)


def test_a_policy_without_spot_hours_keeps_the_assumed_overhead(
    daemon: Daemon, files: tuple[Path, Path], tmp_path: Path
) -> None:
    catalog, policy = files
    night = tmp_path / "night.yaml"
    night.write_text(policy.read_text().replace("name: team", "name: night"))
    data = tco(daemon, catalog, "--policy", str(night))
    assert data["hours_per_month"] == pytest.approx(5.0)  # its one month
    said = "the ledger has no spot hours yet: the assumptions' spot.overhead_fraction (10%) is used"
    assert said in data["notes"]
    assert data["assumptions"]["spot.overhead_fraction"]["value"] == pytest.approx(0.10)
