"""The ledger's surfaces: the report's JSON (pure), `GET /costs` and `GET /jobs/{name}` on a
real daemon, and `gpuopt costs` through that daemon's API (table, --json, --csv, bad input)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from optimizer.clock import ManualClock
from optimizer.costs import Cost, GroupBy, Line
from optimizer.costs.lines import totals_by
from optimizer.costs.report import TimeError, add_up, parse_time, report, summary
from optimizer.daemon.service import Daemon
from optimizer.model import Market
from tests.helpers import TOKEN, api, make_config, running
from tests.helpers.costs import T0, at, attempt, ended, observe

pytestmark = pytest.mark.usefixtures("daemon_env")

NOW = T0 + timedelta(days=2)


# -- the report (pure) -------------------------------------------------------------------------


def line(job: str, number: int, market: str, cost: Cost, month: int = 3) -> Line:
    return Line(
        job_id=hash(job) % 1000,
        job=job,
        policy="team",
        attempt=number,
        provider="aws",
        region="us-east-1",
        zone="use1-az1",
        instance_type="g5.xlarge",
        market=market,
        instance_id=f"i-{job}-{number}",
        launched=datetime(2026, month, 3, tzinfo=UTC),
        ended=datetime(2026, month, 4, tzinfo=UTC),
        period_start=datetime(2026, month, 1, tzinfo=UTC),
        period_end=datetime(2026, month + 1, 1, tzinfo=UTC),
        cost=cost,
        frozen=True,
    )


def grouped(lines: list[Line], by: GroupBy) -> list[dict[str, Any]]:
    """The report as GET /costs builds it from lines."""
    return report(totals_by(lines, by, markets=True), lines if by is GroupBy.JOB else None)


SPOT_A = Cost(3600, spend_usd=30.0, on_demand_usd=100.0, overhead_seconds=600, overhead_usd=5.0)
SPOT_B = Cost(3600, spend_usd=8.0, on_demand_usd=100.0, overhead_seconds=60, overhead_usd=0.0)
UNPRICED = Cost(1800, spend_usd=4.0, on_demand_usd=0.0, baseline_known=False)
ON_DEMAND = Cost(3600, spend_usd=50.0, storage_usd=1.0, on_demand_usd=50.0)


def test_groups_sum_their_lines_and_savings_count_only_lines_with_a_baseline() -> None:
    lines = [
        line("a", 1, "spot", SPOT_A),
        line("a", 2, "spot", SPOT_B),
        line("a", 2, "spot", UNPRICED, month=4),  # attempt 2 again, in April, no baseline
        line("b", 1, "on_demand", ON_DEMAND),
    ]
    a, b = grouped(lines, GroupBy.JOB)
    assert a["group"] == "a" and a["attempt_count"] == 2
    assert a["spend_usd"] == 42.0 and a["on_demand_usd"] == 200.0
    # savings over the priced lines only: 200 - 38, not 200 - 42
    assert a["savings_usd"] == 162.0 and a["savings_fraction"] == pytest.approx(0.81)
    assert a["net_savings_fraction"] == pytest.approx((162 - 5) / 200)
    assert a["billed_seconds"] == 9000 and a["overhead_seconds"] == 660
    assert a["baseline_known"] is False
    first, second = a["attempts"]
    assert (first["attempt"], first["spend_usd"], first["savings_usd"]) == (1, 30.0, 70.0)
    # an attempt's lines of several months are one attempt entry
    assert (second["attempt"], second["spend_usd"], second["billed_seconds"]) == (2, 12.0, 5400)
    assert {"provider", "region", "zone", "instance_type", "market", "launched", "ended"} <= set(
        second
    )
    assert b["total_usd"] == 51.0 and b["savings_usd"] == 0.0
    totals = add_up([a, b])
    assert totals["spend_usd"] == 92.0 and totals["on_demand_usd"] == 250.0
    assert totals["savings_fraction"] == pytest.approx(162 / 250)
    assert totals["net_savings_fraction"] == pytest.approx(157 / 250)
    assert totals["attempt_count"] == 3
    assert "attempts" not in grouped(lines, GroupBy.POLICY)[0]


def test_the_summary_line_says_what_spot_saved_gross_and_net_of_overhead() -> None:
    # spot in two months: the line adds up each month's spot part (one request, any grouping)
    spot = [line("a", 1, "spot", SPOT_A), line("a", 2, "spot", SPOT_B, month=4)]
    lines = [*spot, line("b", 1, "on_demand", ON_DEMAND)]
    march, april = grouped(lines, GroupBy.MONTH)
    assert set(march["markets"]) == {"spot", "on_demand"} and set(april["markets"]) == {"spot"}
    assert march["markets"]["spot"]["savings_usd"] == 70.0
    assert march["markets"]["on_demand"]["total_usd"] == 51.0
    expected = "spot saved 81% gross, 78% net of overhead ($162.00 of $200.00 on-demand; "
    for by in GroupBy:
        assert summary(grouped(lines, by)).startswith(expected), by
    assert summary(grouped([line("b", 1, "on_demand", ON_DEMAND)], GroupBy.MARKET)) == (
        "no spot attempts in this window"
    )


def test_by_market_owned_machines_are_a_group_of_their_own_and_the_line_names_them() -> None:
    owned = Cost(7200, spend_usd=0.3, on_demand_usd=0.0, baseline_known=False)
    lines = [line("a", 1, "spot", SPOT_A), line("b", 1, "owned", owned)]
    groups = grouped(lines, GroupBy.MARKET)
    assert [g["group"] for g in groups] == ["owned", "spot"]
    assert groups[0]["spend_usd"] == 0.3 and groups[0]["savings_usd"] == 0.0
    said = summary(groups)
    assert said.startswith("spot saved 70% gross")  # owned attempts are not spot's
    assert said.endswith("; owned machines: $0.30 for 2.0 h at their TCO rate")
    assert "owned machines" not in summary(grouped(lines[:1], GroupBy.MARKET))


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("2026-03", datetime(2026, 3, 1, tzinfo=UTC)),
        ("2026-03-14", datetime(2026, 3, 14, tzinfo=UTC)),
        ("2026-03-14T12:30:00Z", datetime(2026, 3, 14, 12, 30, tzinfo=UTC)),
        ("2026-03-14T14:30:00+02:00", datetime(2026, 3, 14, 12, 30, tzinfo=UTC)),
    ],
)
def test_times_are_months_dates_or_iso_times_in_utc(text: str, when: datetime) -> None:
    assert parse_time(text, "--since") == when


@pytest.mark.parametrize("text", ["yesterday", "2026-13", "2026-02-30", ""])
def test_a_bad_time_names_its_option(text: str) -> None:
    with pytest.raises(TimeError, match=r"^--until: expected a month"):
        parse_time(text, "--until")


# -- GET /costs and GET /jobs/{name} on a real daemon ------------------------------------------


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running(make_config(tmp_path), clock=ManualClock(NOW)) as d:
        store = d.store
        observe(store, at(72), 0.60)  # spot: 0.40 at launch, 0.60 from minute 72
        observe(store, T0 - timedelta(days=1), 1.00, market=Market.ON_DEMAND)
        # train: interrupted by the cloud at minute 40 (free), then 60 minutes at 0.60
        attempt(store, "train", 1, job_started=at(5), job_exited=at(38), **ended(40, "cloud"))
        attempt(store, "train", 2, launched=at(42), job_started=at(45), **ended(102))
        # eval: another policy, still running at NOW on the same pool
        attempt(store, "eval", policy="night", launched=at(60), job_started=at(61))
        yield d


def test_costs_by_job_lists_each_jobs_attempts_with_their_figures(daemon: Daemon) -> None:
    with api(daemon) as client:
        groups = client.get("/costs", params={"by": "job"}).json()
    assert [g["group"] for g in groups] == ["eval", "train"]
    evaluation, train = groups
    first, second = train["attempts"]
    assert first["refunded"] and first["spend_usd"] == 0.0
    assert first["on_demand_usd"] == pytest.approx(40 / 60)
    # 30 minutes at its launch price 0.40, 30 at 0.60
    assert second["spend_usd"] == pytest.approx(0.20 + 0.30)
    assert second["overhead_seconds"] == 180  # minutes 42-45
    assert train["savings_usd"] == pytest.approx(40 / 60 + (1.0 - 0.50))
    assert (second["launched"], second["ended"]) == ("2026-03-10T12:42:00Z", "2026-03-10T13:42:00Z")
    # live: from minute 60 to the daemon's now, 12 minutes at 0.40, then at 0.60
    live_seconds = (NOW - at(60)).total_seconds()
    assert evaluation["attempts"][0]["ended"] is None
    assert evaluation["billed_seconds"] == live_seconds
    assert evaluation["spend_usd"] == pytest.approx(0.08 + 0.60 * (live_seconds - 720) / 3600)


def test_costs_filters_and_refuses_bad_parameters_naming_them(daemon: Daemon) -> None:
    with api(daemon) as client:
        by_policy = client.get("/costs", params={"by": "policy"}).json()
        night = client.get("/costs", params={"by": "month", "policy": "night"}).json()
        none_yet = client.get("/costs", params={"since": "2026-04"}).json()
        bad_since = client.get("/costs", params={"since": "soon"})
        bad_by = client.get("/costs", params={"by": "team"})
        no_job = client.get("/costs", params={"job": "nobody"})
    assert [g["group"] for g in by_policy] == ["night", "team"]
    assert [g["group"] for g in night] == ["2026-03"] and night[0]["attempt_count"] == 1
    assert none_yet == []
    assert bad_since.status_code == 422 and bad_since.json()["detail"].startswith("since:")
    assert bad_by.status_code == 422
    assert no_job.status_code == 404


def test_show_job_lists_its_attempts_with_their_cost_lines(daemon: Daemon) -> None:
    with api(daemon) as client:
        job = client.get("/jobs/train").json()
    first, second = job["attempts"]
    assert (first["number"], first["terminated_by"], first["instance_id"]) == (
        1,
        "cloud",
        "i-train-1",
    )
    (refunded,) = first["cost_lines"]
    assert refunded["month"] == "2026-03" and refunded["refunded"]
    (line_two,) = second["cost_lines"]
    assert line_two["spend_usd"] == pytest.approx(0.50)
    assert line_two["period_start"] == "2026-03-01T00:00:00Z"


# -- gpuopt costs, through the daemon's API ----------------------------------------------------


def gpuopt_costs(daemon: Daemon, *args: str) -> Any:
    from optimizer.cli import app

    return CliRunner().invoke(
        app, ["costs", *args, "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN}
    )


def test_the_cli_prints_the_apis_json_and_csv(daemon: Daemon) -> None:
    as_json = gpuopt_costs(daemon, "--by", "job", "--json")
    assert as_json.exit_code == 0, as_json.output
    with api(daemon) as client:
        assert json.loads(as_json.stdout) == client.get("/costs", params={"by": "job"}).json()
    as_csv = gpuopt_costs(daemon, "--by", "market", "--csv")
    assert as_csv.exit_code == 0, as_csv.output
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [r["group"] for r in rows] == ["spot"]
    assert float(rows[0]["spend_usd"]) == pytest.approx(
        sum(g["spend_usd"] for g in json.loads(as_json.stdout))
    )


def test_the_cli_table_has_a_totals_row_and_the_savings_line(daemon: Daemon) -> None:
    shown = gpuopt_costs(daemon, "--by", "policy", "--since", "2026-03", "--until", "2026-04")
    assert shown.exit_code == 0, shown.output
    rows = [r for r in shown.stdout.splitlines() if r.strip()]
    assert any(r.strip("│ ").startswith("night") for r in rows)
    assert any(r.strip("│ ").startswith("total") for r in rows)
    assert rows[-1].startswith("spot saved ") and "net of overhead" in rows[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--by", "team"], "gpuopt: error: --by: expected one of job, policy, provider, market"),
        (["--since", "soon"], "gpuopt: error: --since: expected a month (2026-03)"),
        (["--until", "2026-02-30"], "gpuopt: error: --until: expected a month (2026-03)"),
        (["--json", "--csv"], "gpuopt: error: --json and --csv: choose one"),
    ],
)
def test_bad_cli_input_is_one_line_naming_the_option(
    daemon: Daemon, args: list[str], message: str
) -> None:
    result = gpuopt_costs(daemon, *args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(message), result.stderr
