"""The progress convention and what the daemon works out of it (docs/progress.md): the lines
a job writes (the helper, the CLI one-liner, malformed lines), each attempt's speed measured
from its first report, the speed per instance type across attempts, the work left and the ETA
at a fixed clock, and the store's rows on each engine."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from optimizer import progress as convention
from optimizer import protocol
from optimizer.cli import app
from optimizer.jobs.progress import (
    JobProgress,
    attempt_speed,
    job_progress,
    progress_of,
    speeds_by_type,
)
from optimizer.jobs.spec import RESERVED_ENV
from optimizer.store import ProgressRecord, Store
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.offers import T0


def row(
    attempt: int,
    kind: str,
    first: tuple[int, float],
    newest: tuple[int, float],
    total: int | None = 10_000,
) -> ProgressRecord:
    """An attempt's row: (step, minutes after T0) of its first and newest reports."""
    return ProgressRecord(
        attempt_id=attempt,
        job_id=1,
        instance_type=kind,
        first_step=first[0],
        first_at=T0 + timedelta(minutes=first[1]),
        step=newest[0],
        at=T0 + timedelta(minutes=newest[1]),
        total=total,
        reports=2,
    )


# -- the convention ----------------------------------------------------------------------------


def test_the_env_name_is_the_protocols_and_a_spec_may_not_set_it() -> None:
    assert convention.ENV == protocol.ENV_PROGRESS_FILE == "GPUOPT_PROGRESS_FILE"
    assert "GPUOPT_PROGRESS_FILE" in RESERVED_ENV


def test_the_helper_appends_one_line_per_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "progress.jsonl"
    monkeypatch.setenv("GPUOPT_PROGRESS_FILE", str(target))
    assert convention.report(10, 100) and convention.report(20)
    assert target.read_text().splitlines() == ['{"step": 10, "total": 100}', '{"step": 20}']
    assert [convention.parse_line(x) for x in target.read_text().splitlines()] == [
        convention.Report(10, 100),
        convention.Report(20, None),
    ]


def test_outside_gpuopt_the_helper_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUOPT_PROGRESS_FILE", raising=False)
    assert convention.report(5) is False


def test_an_unwritable_file_never_raises(tmp_path: Path) -> None:
    assert convention.report(5, path=tmp_path / "missing" / "p.jsonl") is False


def test_the_helper_refuses_a_bad_step_naming_it() -> None:
    with pytest.raises(ValueError, match=r"step must be a whole number, not 1\.5"):
        convention.report(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"total must be between 1 and 2\*\*62, not 0"):
        convention.line(3, 0)


def test_the_helper_loads_no_dependency() -> None:
    # What a job pays for the import: the standard library only (no pydantic, no torch).
    code = (
        "import sys; import optimizer.progress; "
        "print(sorted(m for m in ('pydantic', 'torch', 'sqlalchemy', 'httpx') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("step 10", "not JSON"),
        ("[10, 100]", "not a JSON object"),
        ('{"total": 100}', "no step"),
        ('{"step": "10"}', "step must be a whole number, not '10'"),
        ('{"step": true}', "step must be a whole number, not True"),
        ('{"step": -1}', "step must be between 0 and 2**62, not -1"),
        ('{"step": 10, "total": 0}', "total must be between 1 and 2**62, not 0"),
        ('{"step": 1e3}', "step must be a whole number, not 1000.0"),
        ('{"step": 1, "pad": "' + "x" * 5000 + '"}', "longer than 4096 bytes"),
    ],
)
def test_a_malformed_line_says_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(convention.ProgressLineError) as raised:
        convention.parse_line(text)
    assert why in str(raised.value)


def test_other_keys_of_a_line_are_ignored() -> None:
    line = '{"step": 7, "total": 9, "loss": 0.25}'
    assert convention.parse_line(line) == convention.Report(7, 9)


def test_the_cli_one_liner_appends_the_same_line(tmp_path: Path) -> None:
    target = tmp_path / "p.jsonl"
    env = {"GPUOPT_PROGRESS_FILE": str(target)}
    done = CliRunner().invoke(app, ["progress", "1200", "--total", "10000"], env=env)
    assert done.exit_code == 0, done.output
    done = CliRunner().invoke(app, ["progress", "1300"], env=env)
    assert target.read_text() == '{"step": 1200, "total": 10000}\n{"step": 1300}\n'


def test_the_cli_outside_gpuopt_says_so_and_exits_0() -> None:
    done = CliRunner().invoke(app, ["progress", "5"], env={"GPUOPT_PROGRESS_FILE": ""})
    assert done.exit_code == 0
    assert "GPUOPT_PROGRESS_FILE is not set" in done.stderr


def test_the_cli_refuses_a_negative_step_in_one_line() -> None:
    done = CliRunner().invoke(app, ["progress", "--", "-5"])
    assert done.exit_code == 2
    assert done.stderr == "gpuopt: error: step must be between 0 and 2**62, not -5\n"


# -- speeds and the ETA ------------------------------------------------------------------------


def test_an_attempts_speed_is_measured_from_its_first_report() -> None:
    # Start-up before the first report does not count: 600 steps in the 30 min after it.
    assert attempt_speed(row(1, "g5.xlarge", (400, 10), (1000, 40))) == pytest.approx(1200)


def test_reports_too_close_together_give_no_speed() -> None:
    assert attempt_speed(row(1, "g5.xlarge", (400, 0), (401, 0.05))) is None


def test_speeds_per_type_weigh_each_attempt_by_its_hours() -> None:
    rows = [
        row(1, "g5.xlarge", (0, 0), (1000, 60)),  # 1000 steps/h for an hour
        row(2, "g5.xlarge", (1000, 70), (1500, 100)),  # 1000 steps/h for half an hour
        row(3, "p3.2xlarge", (1500, 110), (3000, 140)),  # 3000 steps/h
        row(4, "g4dn.xlarge", (3000, 150), (3000, 150)),  # one report: no speed
    ]
    assert speeds_by_type(rows) == {
        "g5.xlarge": pytest.approx(1000),
        "p3.2xlarge": pytest.approx(3000),
    }


def test_the_eta_runs_from_the_newest_report_at_the_current_attempts_speed() -> None:
    rows = [row(1, "g5.xlarge", (0, 0), (1000, 60)), row(2, "p3.2xlarge", (1000, 70), (2500, 100))]
    now = T0 + timedelta(minutes=101)
    found = progress_of(rows, now, running=True, ended=False)
    assert found == JobProgress(
        step=2500,
        total=10_000,
        at=T0 + timedelta(minutes=100),
        steps_per_hour=pytest.approx(3000),
        instance_type="p3.2xlarge",
        by_type={"g5.xlarge": pytest.approx(1000), "p3.2xlarge": pytest.approx(3000)},
        eta=T0 + timedelta(minutes=100, hours=2.5),  # 7500 steps left at 3000/h
    )
    assert found.work_left_fraction() == pytest.approx(0.75)
    assert found.to_dict()["eta"] == "2026-01-15T16:10:00Z"
    assert found.to_dict()["fraction_done"] == pytest.approx(0.25)


def test_a_new_attempt_without_a_speed_yet_uses_its_types_earlier_one() -> None:
    rows = [
        row(1, "g5.xlarge", (0, 0), (1000, 60)),
        row(2, "p3.2xlarge", (1000, 70), (2500, 100)),
        row(3, "g5.xlarge", (2500, 110), (2500, 110)),  # just started on g5 again
    ]
    found = progress_of(rows, T0 + timedelta(minutes=110), running=True, ended=False)
    assert found is not None
    assert (found.steps_per_hour, found.instance_type) == (pytest.approx(1000), "g5.xlarge")
    assert found.eta == T0 + timedelta(minutes=110, hours=7.5)


def test_a_new_type_without_a_speed_uses_the_last_measured_attempts() -> None:
    rows = [row(1, "g5.xlarge", (0, 0), (1000, 60)), row(2, "l4.x", (1000, 70), (1000, 70))]
    found = progress_of(rows, T0 + timedelta(minutes=70), running=True, ended=False)
    assert found is not None
    assert (found.steps_per_hour, found.instance_type) == (pytest.approx(1000), "g5.xlarge")


def test_a_job_waiting_for_capacity_counts_from_now() -> None:
    rows = [row(1, "g5.xlarge", (0, 0), (1000, 60))]
    now = T0 + timedelta(hours=3)
    found = progress_of(rows, now, running=False, ended=False)
    assert found is not None and found.eta == now + timedelta(hours=9)


def test_no_eta_without_a_total_or_a_speed_or_once_ended_short() -> None:
    now = T0 + timedelta(hours=2)
    no_total = progress_of(
        [row(1, "t", (0, 0), (10, 60), total=None)], now, running=True, ended=False
    )
    assert no_total is not None and no_total.eta is None and no_total.work_left_fraction() is None
    no_speed = progress_of([row(1, "t", (0, 0), (0, 0.01))], now, running=True, ended=False)
    assert no_speed is not None and no_speed.eta is None and no_speed.steps_per_hour is None
    ended = progress_of([row(1, "t", (0, 0), (10, 60))], now, running=False, ended=True)
    assert ended is not None and ended.eta is None


def test_a_finished_run_is_done_at_its_last_report() -> None:
    rows = [row(1, "t", (0, 0), (10_000, 60))]
    found = progress_of(rows, T0 + timedelta(hours=5), running=False, ended=True)
    assert found is not None and found.eta == T0 + timedelta(hours=1)
    assert found.work_left_fraction() == 0


def test_a_total_left_out_of_the_newest_report_holds() -> None:
    rows = [row(1, "t", (0, 0), (1000, 60)), row(2, "t", (1000, 70), (2000, 130), total=None)]
    found = progress_of(rows, T0 + timedelta(minutes=130), running=True, ended=False)
    assert found is not None and found.total == 10_000


def test_no_reports_no_progress() -> None:
    assert progress_of([], T0, running=True, ended=False) is None


# -- the store ---------------------------------------------------------------------------------


def seeded(store: Store) -> tuple[int, int, int]:
    store.create_all()
    job = store.jobs.add_job("train", "p", {"run": "python t.py"}, at=T0)
    ids = []
    for number, kind in ((1, "g5.xlarge"), (2, "p3.2xlarge")):
        key = f"train-{number}"
        offer = make_offer(instance_type=kind)
        store.jobs.create_attempt(job, number, key, offer, token_sha256(key), T0)
        found = store.jobs.attempt(key)
        assert found is not None
        ids.append(found.id)
    return job, ids[0], ids[1]


def test_the_store_keeps_the_first_and_newest_report_per_attempt(store: Store) -> None:
    job, first, second = seeded(store)

    def record(attempt: int, kind: str, step: int, minutes: float, total: int | None) -> None:
        store.progress.record(
            job_id=job,
            attempt_id=attempt,
            instance_type=kind,
            step=step,
            total=total,
            at=T0 + timedelta(minutes=minutes),
        )

    record(first, "g5.xlarge", 100, 1, 10_000)
    record(first, "g5.xlarge", 600, 31, None)  # the total given before holds
    assert (
        store.progress.record(  # older than the newest: nothing changes
            job_id=job, attempt_id=first, instance_type="g5.xlarge", step=50, total=None, at=T0
        )
        is None
    )
    record(second, "p3.2xlarge", 600, 40, 10_000)
    record(second, "p3.2xlarge", 2100, 70, 10_000)
    a, b = store.progress.of_job(job)
    assert (a.attempt_id, a.first_step, a.step, a.total, a.reports) == (first, 100, 600, 10_000, 2)
    assert (a.first_at, a.at) == (T0 + timedelta(minutes=1), T0 + timedelta(minutes=31))
    assert (b.attempt_id, b.instance_type, b.first_step, b.step) == (
        second,
        "p3.2xlarge",
        600,
        2100,
    )

    found = job_progress(store, job, T0 + timedelta(minutes=71))
    assert found is not None
    assert (found.step, found.total, found.instance_type) == (2100, 10_000, "p3.2xlarge")
    assert found.steps_per_hour == pytest.approx(3000)
    assert found.by_type == {"g5.xlarge": pytest.approx(1000), "p3.2xlarge": pytest.approx(3000)}
    assert found.eta == T0 + timedelta(minutes=70) + timedelta(hours=7900 / 3000)
    assert store.progress.of_jobs([job, 999]).keys() == {job}


def test_a_report_of_fewer_steps_starts_the_measurement_again(store: Store) -> None:
    job, first, _ = seeded(store)
    for step, minutes in ((500, 0), (900, 20), (300, 25), (500, 35)):
        store.progress.record(
            job_id=job,
            attempt_id=first,
            instance_type="g5.xlarge",
            step=step,
            total=None,
            at=T0 + timedelta(minutes=minutes),
        )
    [found] = store.progress.of_job(job)
    assert (found.first_step, found.first_at, found.step) == (300, T0 + timedelta(minutes=25), 500)
    assert attempt_speed(found) == pytest.approx(1200)


def test_the_progress_event_data_is_checked_at_the_edge() -> None:
    ok = protocol.EVENT_DATA[protocol.PROGRESS_EVENT].model_validate({"step": 3, "total": 9})
    assert json.loads(ok.model_dump_json()) == {"step": 3, "total": 9}
    for bad in ({"step": -1}, {"step": "3"}, {"step": 3, "total": 0}, {}):
        with pytest.raises(ValueError):
            protocol.EVENT_DATA[protocol.PROGRESS_EVENT].model_validate(bad)
