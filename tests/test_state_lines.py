"""Cost lines of a job's state (optimizer/costs/state_lines.py): checkpoints at rest by the
GB-month, restores' egress by the GB, their FOCUS rows, and how they add to the report."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from optimizer.costs.focus import write_csv
from optimizer.costs.lines import CHECKPOINT_STORAGE, EGRESS, GroupBy, Line, totals_by
from optimizer.costs.report import attempts, report
from optimizer.costs.state_lines import egress_lines, state_lines, storage_lines
from optimizer.jobs.ledger import state_filter
from optimizer.store import LineFilter, Store

SPEC = yaml.safe_load((Path(__file__).parent / "data" / "focus-1.1-columns.yaml").read_text())
MONTH_S = 730 * 3600


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[arg-type,misc]


@dataclass(frozen=True)
class Checkpoint:  # the fields of a CheckpointRecord the lines read
    job_id: int
    attempt_id: int | None
    name: str
    size_bytes: int
    uri: str
    provider: str | None
    region: str | None
    committed_at: datetime | float
    deleted_at: datetime | float | None


@dataclass(frozen=True)
class Restore:  # the fields of a RestoreRecord the lines read
    job_id: int
    attempt_id: int | None
    checkpoint_name: str
    fetched_bytes: int
    from_provider: str | None
    from_region: str | None
    to_provider: str | None
    to_region: str | None
    at: datetime | float


KEPT_TEN_DAYS = Checkpoint(
    1, 11, "step-500", 10**10, "s3://ckpt/train", "aws", "us-east-1",
    at(2026, 3, 10), at(2026, 3, 20),
)  # fmt: skip
OVER_MONTH_END = Checkpoint(
    2, 21, "step-900", 5 * 10**9, "gs://ckpt/tune", "gcp", "us-central1",
    at(2026, 3, 31, 12).timestamp(), None,
)  # fmt: skip
ACROSS = Restore(1, 12, "step-500", 4 * 10**9, "aws", "eu-central-1", "gcp", "us-central1",
                 at(2026, 3, 21))  # fmt: skip
HOME = Restore(1, 13, "step-500", 4 * 10**9, "aws", "us-east-1", "aws", "us-east-1",
               at(2026, 3, 22))  # fmt: skip
JOBS = {1: ("train", "eu-training"), 2: ("tune", "cheap")}


def test_a_checkpoint_kept_ten_days_costs_its_gb_months() -> None:
    (line,) = storage_lines([KEPT_TEN_DAYS], until=at(2026, 4, 15), jobs=JOBS)
    # 10 GB x 864,000 s / 2,628,000 s = 3.28767 GB-months x $0.023 = $0.075616.
    assert line.quantity == pytest.approx(10 * 864_000 / MONTH_S)
    assert line.cost.storage_usd == pytest.approx(3.287671 * 0.023, abs=1e-7)
    assert line.cost.total_usd == line.cost.storage_usd
    assert (line.job, line.policy, line.kind) == ("train", "eu-training", CHECKPOINT_STORAGE)
    assert line.resource == "s3://ckpt/train/step-500"
    assert (line.period_start, line.period_end) == (at(2026, 3, 1), at(2026, 4, 1))


def test_a_kept_checkpoint_runs_to_until_split_by_month() -> None:
    march, april = storage_lines([OVER_MONTH_END], until=at(2026, 4, 1, 12))
    # 12 h in each month: 5 GB x 43,200 s / 2,628,000 s = 0.082192 GB-months x $0.020.
    for line in (march, april):
        assert line.quantity == pytest.approx(5 * 43_200 / MONTH_S)
        assert line.cost.storage_usd == pytest.approx(0.0821918 * 0.020, abs=1e-8)
    assert (march.month, april.month) == ("2026-03", "2026-04")
    assert march.job == "job-2" and april.ended is None
    assert storage_lines([OVER_MONTH_END], until=at(2026, 3, 1)) == []  # before its commit


def test_a_restore_across_clouds_costs_its_fetched_gb_and_one_at_home_nothing() -> None:
    (line,) = egress_lines([ACROSS, HOME], jobs=JOBS)
    # 4 GB out of AWS to the internet at $0.09/GB = $0.36.
    assert line.cost.network_usd == pytest.approx(0.36)
    assert line.cost.total_usd == pytest.approx(0.36)
    assert (line.quantity, line.kind, line.provider, line.region) == (
        4.0,
        EGRESS,
        "aws",
        "eu-central-1",
    )
    assert "other-cloud" in (line.resource or "")


def test_the_focus_rows_are_storage_and_networking_and_keep_the_spec() -> None:
    lines = state_lines([KEPT_TEN_DAYS], [ACROSS], until=at(2026, 4, 15), jobs=JOBS)
    rows = list(csv.DictReader(io.StringIO(write_csv(lines))))
    assert [r["ServiceCategory"] for r in rows] == ["Storage", "Networking"]
    stored, moved = rows
    assert (stored["PricingUnit"], stored["ServiceName"]) == (
        "GB-Months",
        "Amazon Simple Storage Service",
    )
    assert float(stored["BilledCost"]) == pytest.approx(lines[0].cost.total_usd)
    assert float(stored["PricingQuantity"]) == pytest.approx(10 * 864_000 / MONTH_S)
    assert stored["ChargePeriodStart"] == "2026-03-10T00:00:00Z"
    assert stored["ChargePeriodEnd"] == "2026-03-20T00:00:00Z"
    assert (moved["PricingUnit"], moved["BilledCost"], moved["PricingQuantity"]) == (
        "GB",
        "0.36",
        "4",
    )
    assert json.loads(moved["Tags"])["gpuopt/kind"] == EGRESS
    for row in rows:
        for column, allowed in SPEC["allowed"].items():
            if row.get(column):
                assert row[column] in allowed, column
        assert (
            SPEC["allowed"]["ServiceSubcategory"][row["ServiceSubcategory"]]
            == (row["ServiceCategory"])
        )
        product = float(row["ListUnitPrice"]) * float(row["PricingQuantity"])
        assert product == pytest.approx(float(row["ListCost"]), abs=1e-9)


def test_state_lines_add_to_the_jobs_totals_but_are_no_attempt() -> None:
    lines = state_lines([KEPT_TEN_DAYS], [ACROSS], until=at(2026, 4, 15), jobs=JOBS)
    (train,) = totals_by(lines, GroupBy.JOB)
    assert train.cost.total_usd == pytest.approx(3.287671 * 0.023 + 0.36, abs=1e-6)
    assert train.attempts == 0
    assert attempts(lines) == []
    (row,) = report([train])
    assert row["network_usd"] == pytest.approx(0.36)
    assert row["storage_usd"] == pytest.approx(3.287671 * 0.023, abs=1e-7)


def test_the_ledgers_filter_selects_state_lines_by_window_job_policy_and_kind() -> None:
    lines = state_lines([KEPT_TEN_DAYS, OVER_MONTH_END], [ACROSS], until=at(2026, 4, 2), jobs=JOBS)

    def kept(**where: object) -> list[str]:
        return [
            line.kind + ":" + line.month
            for line in lines
            if state_filter(LineFilter(**where))(line)
        ]  # type: ignore[arg-type]

    assert kept(since=at(2026, 4, 1)) == ["checkpoint-storage:2026-04"]
    assert kept(job_id=1) == ["checkpoint-storage:2026-03", "egress:2026-03"]
    assert kept(policy="cheap", market=CHECKPOINT_STORAGE) == [
        "checkpoint-storage:2026-03",
        "checkpoint-storage:2026-04",
    ]
    assert kept(market="spot") == []


def test_naive_times_are_refused_by_name() -> None:
    naive = Checkpoint(1, 1, "x", 1, "", "aws", "us-east-1", datetime(2026, 3, 1), None)
    with pytest.raises(ValueError, match="naive time"):
        storage_lines([naive], until=at(2026, 4, 1))


def test_the_ledger_adds_the_hooks_state_lines_to_every_surface(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Ledger.lines`, `total` (budgets) and `groups` read the state lines the hook gives,
    filtered like any line; the hook gives none by default."""
    from optimizer.jobs import ledger as jobs_ledger

    ledger = jobs_ledger.Ledger(store)
    now = at(2026, 4, 15)
    assert ledger.lines(now=now) == [] and ledger.total(now=now).total_usd == 0

    def given(_store: Store, where: LineFilter, until: datetime) -> list[Line]:
        lines = state_lines([KEPT_TEN_DAYS], [ACROSS], until=until, jobs=JOBS)
        return [line for line in lines if state_filter(where)(line)]

    monkeypatch.setattr(jobs_ledger, "state_lines_for", given)
    assert [line.kind for line in ledger.lines(now=now)] == [CHECKPOINT_STORAGE, EGRESS]
    assert ledger.total(now=now).total_usd == pytest.approx(3.287671 * 0.023 + 0.36, abs=1e-6)
    assert ledger.total(now=now, since=at(2026, 4, 1)).total_usd == 0
    (group,) = ledger.groups(GroupBy.POLICY, now=now)
    assert (group.key, group.attempts) == ("eu-training", 0)
    assert group.cost.network_usd == pytest.approx(0.36)
