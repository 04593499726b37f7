"""`gpuopt costs --focus` and `GET /costs?format=focus` (the ledger's lines as FOCUS CSV), and
`gpuopt costs --notify` (the cost summary alert on demand), through a real daemon's API."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from optimizer.clock import ManualClock
from optimizer.costs.focus import COLUMNS, write_csv
from optimizer.daemon.service import Daemon
from optimizer.jobs.ledger import Ledger
from optimizer.model import EventKind, Market
from tests.helpers import TOKEN, api, make_config, running
from tests.helpers.costs import T0, at, attempt, ended, observe

pytestmark = pytest.mark.usefixtures("daemon_env")

NOW = T0 + timedelta(days=2)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running(make_config(tmp_path), clock=ManualClock(NOW)) as d:
        store = d.store
        observe(store, at(72), 0.60)  # spot: 0.40 at launch, 0.60 from minute 72
        observe(store, T0 - timedelta(days=1), 1.00, market=Market.ON_DEMAND)
        # train: interrupted by the cloud at minute 40 (free), then 60 minutes, with a disk
        attempt(store, "train", 1, job_started=at(5), **ended(40, "cloud"))
        attempt(store, "train", 2, launched=at(42), disk_gib=100.0, **ended(102))
        attempt(store, "eval", policy="night", launched=at(60))  # still running
        yield d


def gpuopt_costs(daemon: Daemon, *args: str) -> Any:
    from optimizer.cli import app

    return CliRunner().invoke(
        app, ["costs", *args, "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN}
    )


def rows(text: str) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames or ()) == COLUMNS
    return list(reader)


def test_focus_through_the_cli_is_the_ledgers_lines(daemon: Daemon, tmp_path: Path) -> None:
    shown = gpuopt_costs(daemon, "--focus")
    assert shown.exit_code == 0, shown.output
    lines = Ledger(daemon.store).lines(now=NOW)
    assert shown.stdout == write_csv(lines)
    found = rows(shown.stdout)
    # an instance row per line, and a volume row for train's second attempt (100 GiB)
    assert len(found) == len(lines) + 1 == 4
    billed: dict[str, float] = {}
    for row in found:
        billed[row["x_Job"]] = billed.get(row["x_Job"], 0.0) + float(row["BilledCost"])
    for job in ("train", "eval"):
        ledger = Ledger(daemon.store).total(job=job, now=NOW)
        assert billed[job] == pytest.approx(ledger.total_usd, abs=1e-9)
    # train's second attempt: 30 min at 0.40 and 30 at 0.60, listed at on-demand's 1.00/h
    (second,) = [r for r in found if r["x_Attempt"] == "2" and r["ResourceType"] != "Volume"]
    assert float(second["BilledCost"]) == pytest.approx(0.50)
    assert float(second["ListCost"]) == pytest.approx(1.00)
    assert second["PricingCategory"] == "Dynamic" and second["ResourceId"] == "i-train-2"
    # to a file, with the same filters as the table
    target = tmp_path / "train.csv"
    written = gpuopt_costs(daemon, "--job", "train", "--focus", "-o", str(target))
    assert written.exit_code == 0, written.output
    assert written.stdout == f"wrote 3 FOCUS row(s) to {target}\n"
    assert target.read_text() == write_csv(Ledger(daemon.store).lines(job="train", now=NOW))
    later = gpuopt_costs(daemon, "--since", "2026-04", "--focus")
    assert later.exit_code == 0 and rows(later.stdout) == []


def test_focus_from_the_api_is_csv(daemon: Daemon) -> None:
    with api(daemon) as client:
        answer = client.get("/costs", params={"format": "focus", "policy": "night"})
        bad = client.get("/costs", params={"format": "xml"})
    assert answer.headers["content-type"].startswith("text/csv")
    (only,) = rows(answer.text)
    assert (only["x_Job"], only["ChargePeriodEnd"]) == ("eval", "2026-03-12T12:00:00Z")
    assert bad.status_code == 422


def test_focus_and_notify_refuse_what_does_not_apply(daemon: Daemon, tmp_path: Path) -> None:
    both = gpuopt_costs(daemon, "--json", "--focus")
    assert both.exit_code == 2 and both.stderr == "gpuopt: error: --json and --focus: choose one\n"
    nowhere = gpuopt_costs(daemon, "--focus", "--output", str(tmp_path / "missing" / "x.csv"))
    assert nowhere.exit_code == 2
    assert nowhere.stderr.startswith("gpuopt: error: --output: cannot write ")
    assert nowhere.stderr.count("\n") == 1
    alone = gpuopt_costs(daemon, "--output", str(tmp_path / "x.csv"))
    assert alone.exit_code == 2
    assert alone.stderr == (
        f"gpuopt: error: --output {tmp_path / 'x.csv'}: expected wide or json "
        "(a file only with --focus)\n"
    )
    scoped = gpuopt_costs(daemon, "--notify", "--job", "train")
    assert scoped.exit_code == 2
    assert scoped.stderr == (
        "gpuopt: error: --notify: summarizes every job; only --since and --until apply\n"
    )


def test_notify_raises_the_summary_now(daemon: Daemon) -> None:
    february = gpuopt_costs(daemon, "--notify")  # last month by default: nothing billed
    assert february.exit_code == 0, february.output
    assert "February 2026: nothing billed" in february.stdout
    march = gpuopt_costs(daemon, "--notify", "--since", "2026-03")
    assert march.exit_code == 0, march.output
    first, message = march.stdout.splitlines()
    assert first.startswith("cost summary raised (event ") and "recorded as an event only" in first
    total = Ledger(daemon.store).total(since=T0, now=NOW)
    assert message.startswith(f"March 2026: ${total.total_usd:,.2f} spent")
    recorded = daemon.store.events.of_kind(EventKind.COSTS_MONTHLY_SUMMARY, T0)
    assert [e.data["month"] for e in recorded if e.data] == ["2026-02", "2026-03"]
    assert all(e.data and e.data["trigger"] == "request" for e in recorded)
