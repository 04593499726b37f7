"""The queue (docs/daemon.md): `GET /jobs` answers where each job runs now, its age, running
time and spend so far, and takes `live=true`; `gpuopt jobs list` prints them as a table
that fits 80 columns, `--all` adds ended jobs, `-o wide` every column; `gpuopt jobs show`
prints the attempts, the policy and the latest events. On a real loopback daemon with a
fixed clock; the test writes the jobs, attempts and events, the job reconciler out of the
daemon's passes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.lifecycle import AttemptState
from optimizer.model import EventKind
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.daemon import TOKEN, api, make_config, running, without_job_passes
from tests.helpers.offers import P4DE_24XLARGE, T0

pytestmark = pytest.mark.usefixtures("daemon_env")

NOW = T0 + timedelta(hours=2)
LIST_HEADERS = "NAME STATE PLACEMENT MARKET $/h AGE RAN RESTARTS SPEND $ PROGRESS REASON"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def daemon(tmp_path: Path, clock: ManualClock) -> Iterator[Daemon]:
    with running(make_config(tmp_path), clock=clock) as d:
        without_job_passes(d)  # the test sets the jobs and attempts
        yield d


def attempt(daemon: Daemon, job: int, number: int, minutes: int, **offer: Any) -> str:
    key = f"{job}-{number}"
    daemon.store.jobs.create_attempt(
        job, number, key, make_offer(**offer), token_sha256(key), T0 + timedelta(minutes=minutes)
    )
    return key


def jobs(daemon: Daemon) -> dict[str, int]:
    """Three jobs: `waiting` (pending, no attempt), `hot` (runs on attempt 1 since T0+15 min
    while attempt 2 launches: a hot handover), `done` (succeeded after 25 minutes)."""
    store = daemon.store.jobs
    ids = {name: store.add_job(name, "p", {"run": "python train.py"}, at=T0) for name in (
        "done", "hot", "waiting"
    )}  # fmt: skip
    for name, state in (("hot", "running"), ("done", "succeeded")):
        store.transition_job(ids[name], expected="pending", state=state, reason="", at=T0)
    old = attempt(daemon, ids["hot"], 1, 10)  # aws us-east-1 g5.xlarge spot $0.40
    store.update_attempt(
        old,
        state=AttemptState.LAUNCHED,
        instance_id="i-hot1",
        launched_at=T0 + timedelta(minutes=10),
        job_started_at=T0 + timedelta(minutes=15),
    )
    attempt(daemon, ids["hot"], 2, 100, **P4DE_24XLARGE, usd_per_hour=12.5)  # launching
    for kind, text in (
        (EventKind.JOB_SUBMITTED, "submitted"),
        (EventKind.JOB_STATE_CHANGED, "runs"),
    ):
        event = daemon.emitter.draft(kind, f"job hot {text}", policy="p", job_id=ids["hot"])
        daemon.store.events.record_event(event)
    ended = attempt(daemon, ids["done"], 1, 0, usd_per_hour=0.5)
    store.update_attempt(
        ended,
        state=AttemptState.ENDED,
        end_reason="succeeded",
        instance_id="i-done1",
        launched_at=T0,
        job_started_at=T0 + timedelta(minutes=5),
        ended_at=T0 + timedelta(minutes=30),
        terminated_at=T0 + timedelta(minutes=30),
        terminated_by="gpuopt",
        instance_gone=True,
    )
    return ids


def cli(*args: str, columns: int | None = None) -> list[str]:
    env = {"GPUOPT_API_TOKEN": TOKEN} | ({} if columns is None else {"COLUMNS": str(columns)})
    done = CliRunner().invoke(app, list(args), env=env)
    assert done.exit_code == 0, done.output
    return done.stdout.splitlines()


def test_the_queue_answers_where_each_job_runs_now_and_what_it_cost(daemon: Daemon) -> None:
    jobs(daemon)
    with api(daemon) as client:
        listed = {j["name"]: j for j in client.get("/jobs").json()["jobs"]}
        live = [j["name"] for j in client.get("/jobs", params={"live": "true"}).json()["jobs"]]
        costs = {g["group"]: g for g in client.get("/costs").json()}
        shown = client.get("/jobs/hot").json()
    assert live == ["waiting", "hot"]
    assert list(listed) == ["waiting", "hot", "done"]
    hot = listed["hot"]
    # Attempt 2 only launches: the job still runs on attempt 1, since its start at T0+15 min.
    assert hot["placement"] == {
        "attempt": 1,
        "provider": "aws",
        "region": "us-east-1",
        "zone": "use1-az1",
        "instance_type": "g5.xlarge",
        "market": "spot",
        "usd_per_hour": 0.4,
        "nodes": 1,
        "running": True,
        "since": "2026-01-15T12:15:00Z",
    }
    assert (hot["age_s"], hot["running_s"]) == (7200, 105 * 60)
    assert listed["waiting"]["placement"] is None and listed["waiting"]["running_s"] == 0
    assert listed["done"]["placement"] is None and listed["done"]["running_s"] == 25 * 60
    # Spend so far is the cost report's spend for the job: one definition.
    for name in ("hot", "done"):
        assert listed[name]["spend_usd"] == pytest.approx(costs[name]["spend_usd"], abs=1e-6)
        assert listed[name]["spend_usd"] > 0
    assert listed["waiting"]["spend_usd"] == 0
    assert {k: shown[k] for k in ("placement", "age_s", "running_s", "spend_usd")} == {
        k: hot[k] for k in ("placement", "age_s", "running_s", "spend_usd")
    }


@pytest.mark.parametrize("columns", [80, 120])
def test_jobs_list_is_a_table_that_fits_the_terminal(daemon: Daemon, columns: int) -> None:
    jobs(daemon)
    with api(daemon) as client:
        spend = {j["name"]: j["spend_usd"] for j in client.get("/jobs").json()["jobs"]}
    lines = cli("jobs", "list", "--api", daemon.url, columns=columns)
    assert all(len(line) <= columns for line in lines), lines
    header, *rows = lines
    assert header.split()[:2] == ["NAME", "STATE"] and "$/h" in header and "SPEND $" in header
    table = rows[: next(n for n, row in enumerate([*rows, "("]) if row.startswith("("))]
    by_name = {row.split()[0]: row for row in table}
    assert list(by_name) == ["waiting", "hot"]  # live jobs only
    assert "aws use1-az1 g5.xlarge" in by_name["hot"] and " 0.4000 " in by_name["hot"]
    assert f"{spend['hot']:,.2f}" in by_name["hot"]
    if columns == 80:
        note = " ".join(rows[len(table) :])
        assert note.startswith("(3 columns hidden to fit 80 columns: RESTARTS, PROGRESS, ")
        assert note.endswith("-o wide shows all)")
    everything = cli("jobs", "list", "--all", "--api", daemon.url, columns=columns)
    assert any(line.startswith("done ") for line in everything)
    wide = cli("jobs", "list", "--all", "-o", "wide", "--api", daemon.url, columns=columns)
    assert wide[0].split() == LIST_HEADERS.split()
    assert wide[1:] == [line for line in cli("jobs", "list", "--all", "--api", daemon.url)[1:]]


def test_an_empty_queue_says_so(daemon: Daemon) -> None:
    assert cli("jobs", "list", "--api", daemon.url) == ["no live jobs (--all shows ended ones)"]
    assert cli("jobs", "list", "--all", "--api", daemon.url) == ["no jobs"]


def test_jobs_show_prints_attempts_policy_and_latest_events(daemon: Daemon) -> None:
    jobs(daemon)
    lines = cli("jobs", "show", "hot", "--api", daemon.url, columns=80)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0] == "hot: running (policy p, restarts 0)"
    assert "  now on: aws use1-az1 g5.xlarge, spot at $0.4000/h" in lines
    assert any(line.startswith("  age 2.0 h, ran 1.8 h, spend so far $") for line in lines)
    assert "  policy: p" in lines
    start = lines.index("Attempts")
    assert lines[start + 1].split()[:2] == ["#", "PLACEMENT"]
    one, two = lines[start + 2], lines[start + 3]
    assert one.split()[:4] == ["1", "aws", "use1-az1", "g5.xlarge"] and "0.4000" in one
    assert two.split()[:4] == ["2", "aws", "use1-az1", "p4de.24xlarge"] and "12.5000" in two
    events = lines.index("Latest 2 events (gpuopt jobs events hot shows all)")
    assert lines[events + 1].split()[:3] == ["AT", "(UTC)", "SEVERITY"]
    assert lines[events + 2].split()[3:] == ["job.submitted", "job", "hot", "submitted"]
    assert lines[events + 3].split()[3:] == ["job.state_changed", "job", "hot", "runs"]
    done = cli("jobs", "show", "done", "--api", daemon.url, "--wide")
    row = done[done.index("Attempts") + 2]
    assert row.split() == [
        "1", "aws", "use1-az1", "g5.xlarge", "spot", "0.5000", "01-15", "12:00", "01-15",
        "12:30", "30", "min", "succeeded", "(by", "gpuopt)", row.split()[-1],
    ]  # fmt: skip


def test_the_effective_policy_is_printed_when_the_api_gives_one() -> None:
    """`jobs show`'s policy block: the name, or the effective policy (the job's inline
    resources merged over its policy) in the plan's words once the API answers one."""
    from optimizer.answers import JobDetail
    from optimizer.cli.queue import policy_lines

    base: dict[str, Any] = {
        "id": 1, "name": "a", "policy": "default", "state": "pending", "reason": None,
        "restarts": 0, "created_at": None, "updated_at": None, "cancel_requested_at": None,
        "removed_at": None, "spec": {}, "attempts": [], "gpu": None,
    }  # fmt: skip
    assert policy_lines(JobDetail.model_validate(base)) == ["policy: default"]
    effective = {
        "markets": ["spot", "on_demand"],
        "workload": {"gpus": 1, "gpu_model": "T4"},
        "bid": {"max_usd_per_hour": 0.5},
    }
    shown = policy_lines(JobDetail.model_validate({**base, "effective_policy": effective}))
    assert shown == [
        "effective policy default:",
        "  runs on: 1 GPU; markets spot, on_demand",
        "  where: providers ; regions *",
        "  bid: $0.5/h; no budget",
        "  recovery: up to 20 restarts; migration off",
    ]


def test_the_progress_cell_gives_no_eta_once_the_job_reached_its_total() -> None:
    from optimizer.answers import ProgressView
    from optimizer.cli.jobs import progress_cell

    def view(step: int, eta: str | None) -> ProgressView:
        return ProgressView(
            step=step, total=600, at=None, fraction_done=step / 600, steps_per_hour=3600.0,
            instance_type="g5.xlarge", by_type={}, eta=eta,
        )  # fmt: skip

    assert progress_cell(view(150, "2026-12-05T00:10:00Z")) == "25% ETA 12-05 00:10"
    assert progress_cell(view(600, "2026-12-04T23:59:00Z")) == "100%"
    assert progress_cell(None) == "-"
