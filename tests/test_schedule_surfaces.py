"""Every surface that shows a ranking ranks the policy in force now: inside a schedule window
that allows on-demand only, the console's Offers page, GET /offers?policy=, GET
/jobs/{name}/advice and `gpuopt advise` give on-demand offers only (a real daemon serving the
console on loopback, its clock injected and inside the window)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.model import Market
from optimizer.store import token_sha256
from optimizer.store.telemetry import GpuMinute
from optimizer.ui import console_app
from policies.engine import evaluate
from policies.loader import parse_policy
from tests.helpers import TOKEN, api, make_config, make_offer, running, wait_until, write_policy
from tests.helpers.offers import FakeSource

pytestmark = pytest.mark.usefixtures("daemon_env")

NOW = datetime(2026, 3, 14, 12, 0, tzinfo=UTC)  # a Saturday: inside the weekend window
H = timedelta(hours=1)
# As written: spot or on-demand, cheapest first. At weekends (UTC) on-demand only.
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: train
workload: {gpus: 1, gpu_memory_gib: 10}
markets: [spot, on_demand]
schedule:
  timezone: UTC
  windows:
    - name: weekend-on-demand
      days: [sat, sun]
      hours: "00:00-24:00"
      markets: [on_demand]
"""
SPOT = make_offer(observed_at=NOW, usd_per_hour=0.40)
SPOT_2 = make_offer(observed_at=NOW, usd_per_hour=0.45, zone="use1-az2")
ON_DEMAND = make_offer(observed_at=NOW, zone=None, market=Market.ON_DEMAND, usd_per_hour=1.00)
# Where the job runs now: a big on-demand A100, so the advice looks for a cheaper fit.
A100 = make_offer(
    observed_at=NOW, instance_type="p4de.24xlarge", gpu_model="A100-80GB", gpu_memory_gib=80.0,
    market=Market.ON_DEMAND, zone=None, usd_per_hour=3.00,
)  # fmt: skip


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "train.yaml", POLICY)
    source = FakeSource([SPOT, SPOT_2, ON_DEMAND, A100])
    config = make_config(tmp_path, policy_dir=tmp_path / "policies")
    with running(config, face=console_app, clock=ManualClock(NOW), sources={"aws": source}) as d:
        for poll in d.polls:
            poll.run_once()
        wait_until(lambda: d.registry.get("train") is not None, 10, "the policy loaded")
        wait_until(lambda: len(d.store.prices.latest_offers()) == 4, 10, "offers stored")
        yield d


def add_job(daemon: Daemon) -> None:
    """A job that ran on the A100 and peaked at 8 GiB: an A10G fits it."""
    store = daemon.store
    job_id = store.jobs.add_job("resnet", "train", {"run": "x"}, at=NOW - 10 * H)
    # Ended at once: a pending job is the running daemon's to launch, which would race this.
    store.jobs.transition_job(
        job_id, expected="pending", state="succeeded", reason="exit 0", at=NOW - H
    )
    key = "resnet-1"
    attempt = store.jobs.create_attempt(job_id, 1, key, A100, token_sha256(key), NOW - 4 * H)
    store.jobs.update_attempt(key, ended_at=NOW - H, state="ended")
    minute = GpuMinute(
        start=NOW - 3 * H, samples=6, gpus=1, util_mean=0.5, memory_used_gib_max=8.0,
        memory_total_gib=80.0,
    )  # fmt: skip
    store.telemetry.add(attempt.id, [minute])


def test_the_engine_ranks_the_window_in_force_at_its_instant() -> None:
    policy = parse_policy(POLICY)
    inside = evaluate(policy, [SPOT, ON_DEMAND], NOW)
    assert [c.offer.market for c in inside.candidates] == [Market.ON_DEMAND]
    monday = evaluate(policy, [SPOT, ON_DEMAND], NOW + 2 * 24 * H)
    assert [c.offer.market for c in monday.candidates] == [Market.SPOT, Market.ON_DEMAND]


def test_the_offers_api_ranks_only_on_demand_inside_the_window(daemon: Daemon) -> None:
    with api(daemon) as client:
        offers = client.get("/offers", params={"policy": "train"}).json()
    assert offers["window"] == "weekend-on-demand"
    assert {c["offer"]["market"] for c in offers["candidates"]} == {"on_demand"}
    assert offers["candidate_count"] == 2  # the A10G and the A100, on demand


def test_the_advice_api_and_cli_advise_only_on_demand_inside_the_window(daemon: Daemon) -> None:
    add_job(daemon)
    with api(daemon) as client:
        advice = client.get("/jobs/resnet/advice").json()
    assert advice["status"] == "cheaper_fit", advice["reason"]
    assert advice["advised"]["offer"]["market"] == "on_demand"
    assert advice["advised"]["offer"]["usd_per_hour"] == pytest.approx(1.00)
    cli = CliRunner().invoke(
        app, ["advise", "resnet", "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN}
    )
    assert cli.exit_code == 0, cli.output
    assert "advised: aws g5.xlarge on_demand in us-east-1" in cli.output
    assert " spot " not in cli.output


def test_the_console_offers_page_shows_only_on_demand_inside_the_window(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=10) as browser:
        assert browser.post("/ui/login", data={"token": TOKEN}).status_code == 303
        page = browser.get("/ui/offers", params={"policy": "train"})
    assert page.status_code == 200
    assert "Candidates: 2</h2>" in page.text
    table = page.text.split('id="candidates"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<td>(spot|on_demand)</td>", table) == ["on_demand", "on_demand"]
    assert "schedule window <strong>weekend-on-demand</strong> in force" in page.text


RULE_BUILDERS = {"RuleSet", "judge", "shapes"}  # policies.rules / policies.columnar


def test_nothing_outside_policies_builds_the_rules_itself() -> None:
    """Every ranking reads its rules from `policies.rules.RuleSet`, which takes the policy in
    force at its instant: a module above policies/ that built rules another way could rank a
    scheduled policy as written."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted((root / "optimizer").rglob("*.py")) + sorted((root / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in {
                "policies.rules",
                "policies.columnar",
            }:
                names = {a.name for a in node.names} & RULE_BUILDERS
                if names:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {sorted(names)}")
    assert found == [], "rank through policies.engine.evaluate or launch_ranking instead"
