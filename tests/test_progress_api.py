"""Progress through the daemon (docs/progress.md), on a real loopback server with a fixed
clock: the agents' `progress` reports become each attempt's rows (bad data refused, a report
sent again changing nothing), the job object's `progress` (GET /jobs, /jobs/{name}),
`gpuopt jobs show` and `jobs list`, the console's job page and list show the step, speeds
and ETA, and `GET /offers?job=` ranks under `rank_by: price_per_step` by the job's speed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.clock import ManualClock, utc_text
from optimizer.daemon.service import Daemon
from optimizer.store.jobs import token_sha256
from optimizer.ui import console_app
from tests.helpers import make_offer
from tests.helpers.daemon import TOKEN, api, make_config, running
from tests.helpers.offers import G6_XLARGE, T0
from tests.helpers.policies import write_policy
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.usefixtures("daemon_env")

PER_STEP = (
    "apiVersion: gpuopt/v1\nkind: Policy\nname: steps\n"
    "workload: {gpus: 1, gpu_memory_gib: 10}\nmarkets: [spot]\nrank_by: price_per_step\n"
)
G5 = make_offer(usd_per_hour=0.40)  # A10G
G6 = make_offer(**G6_XLARGE, usd_per_hour=0.30)  # L4


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def daemon(tmp_path: Path, clock: ManualClock) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "steps.yaml", PER_STEP)
    config = make_config(tmp_path)
    with running(config, clock=clock, face=console_app) as d:
        with api(d) as client:
            wait_until(lambda: client.get("/policies/steps").status_code == 200, what="policy")
        d.store.prices.record_offers([G5, G6])
        yield d


def add(daemon: Daemon, policy: str = "p") -> int:
    """A job under a policy the reconcile loop leaves alone (`p` is not loaded)."""
    return daemon.store.jobs.add_job("train", policy, {"run": "python train.py"}, at=T0)


def attempt(daemon: Daemon, job: int, number: int, **offer: Any) -> tuple[str, str]:
    key, token = f"{job}-{number}", f"token-{job}-{number}"
    start = T0 + timedelta(minutes=10 * (number - 1))
    daemon.store.jobs.create_attempt(
        job, number, key, make_offer(**offer), token_sha256(token), start
    )
    return key, token


def report(
    daemon: Daemon, node: tuple[str, str], eid: str, minutes: float, **data: Any
) -> httpx.Response:
    key, token = node
    event = {"id": eid, "kind": "progress", "at": utc_text(T0 + timedelta(minutes=minutes))}
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        return client.post(
            "/agent/v1/events",
            json={"attempt_key": key, "events": [{**event, "data": data}]},
            headers={"Authorization": f"Bearer {token}"},
        )


def cli(daemon: Daemon, *args: str) -> str:
    done = CliRunner().invoke(app, [*args, "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN})
    assert done.exit_code == 0, done.output
    return done.stdout


def test_reports_become_progress_speeds_and_an_eta_on_every_face(
    daemon: Daemon, clock: ManualClock
) -> None:
    job = add(daemon)
    first = attempt(daemon, job, 1)  # g5.xlarge
    for eid, minutes, step in (("a1", 2, 100), ("a2", 32, 600)):
        clock.set(T0 + timedelta(minutes=minutes))
        assert report(daemon, first, eid, minutes, step=step, total=10_000).status_code == 200
    assert report(daemon, first, "a2", 32, step=600, total=10_000).status_code == 200  # again
    daemon.store.jobs.update_attempt(first[0], ended_at=T0 + timedelta(minutes=33))
    second = attempt(daemon, job, 2, **G6_XLARGE)  # g6.xlarge, from T0 + 10 min
    for eid, minutes, step in (("b1", 40, 600), ("b2", 70, 2100)):
        clock.set(T0 + timedelta(minutes=minutes))
        assert report(daemon, second, eid, minutes, step=step).status_code == 200
    clock.set(T0 + timedelta(minutes=71))

    [one, two] = daemon.store.progress.of_job(job)
    assert (one.first_step, one.step, one.reports) == (100, 600, 2)
    assert (two.instance_type, two.first_step, two.step, two.total) == (
        "g6.xlarge",
        600,
        2100,
        None,
    )

    with api(daemon) as client:
        shown = client.get("/jobs/train").json()["progress"]
        listed = client.get("/jobs").json()["jobs"][0]["progress"]
    assert shown == listed
    assert shown == {
        "step": 2100,
        "total": 10_000,  # the total the first attempt gave
        "at": "2026-01-15T13:10:00Z",
        "fraction_done": pytest.approx(0.21),
        "steps_per_hour": pytest.approx(3000),  # 1500 steps in 30 min since b1
        "instance_type": "g6.xlarge",
        "by_type": {"g5.xlarge": pytest.approx(1000), "g6.xlarge": pytest.approx(3000)},
        "eta": utc_text(T0 + timedelta(minutes=70) + timedelta(hours=7900 / 3000)),
    }

    lines = cli(daemon, "jobs", "show", "train").splitlines()
    assert (
        "  progress: step 2,100 of 10,000 (21%) at 2026-01-15 13:10 UTC, 3,000 steps/h on "
        "g6.xlarge; ETA 2026-01-15 15:48 UTC"
    ) in lines
    assert "  steps/h by instance type: g5.xlarge 1,000, g6.xlarge 3,000" in lines
    header, row = cli(daemon, "jobs", "list").splitlines()
    assert header.split()[0] == "NAME" and row.startswith("train ")
    assert "21% ETA 01-15 15:48" in row

    with httpx.Client(base_url=daemon.url, timeout=10) as page:
        assert page.post("/ui/login", data={"token": TOKEN}).status_code == 303
        job_page = page.get("/ui/jobs/train").text
        jobs_page = page.get("/ui/jobs").text
    assert 'id="job-progress">step 2,100 of 10,000 (21%)' in job_page
    assert "3,000 steps/h on g6.xlarge" in job_page
    assert 'id="job-eta"><time datetime="2026-01-15T15:48:00Z">' in job_page
    assert "g5.xlarge 1,000, g6.xlarge 3,000" in job_page
    assert '<td class="progress">21% · ETA <time datetime="2026-01-15T15:48:00Z">' in jobs_page


def test_a_job_without_reports_has_no_progress_anywhere(daemon: Daemon) -> None:
    add(daemon)
    with api(daemon) as client:
        assert client.get("/jobs/train").json()["progress"] is None
    assert "progress" not in cli(daemon, "jobs", "show", "train")
    with httpx.Client(base_url=daemon.url, timeout=10) as page:
        assert page.post("/ui/login", data={"token": TOKEN}).status_code == 303
        assert 'id="job-progress"' not in page.get("/ui/jobs/train").text


@pytest.mark.parametrize(
    ("data", "field"),
    [({"step": -1}, "step"), ({"step": "7"}, "step"), ({"step": 1, "total": 0}, "total")],
)
def test_a_bad_progress_report_is_refused_naming_the_field(
    daemon: Daemon, data: dict[str, Any], field: str
) -> None:
    job = add(daemon)
    node = attempt(daemon, job, 1)
    refused = report(daemon, node, "x1", 1, **data)
    assert refused.status_code == 422, refused.text
    [problem, *_] = refused.json()["detail"]
    assert problem["loc"][:5] == ["body", "events", 0, "data", field]
    assert daemon.store.progress.of_job(job) == []


def test_offers_for_a_job_rank_by_its_measured_price_per_step(
    daemon: Daemon, clock: ManualClock
) -> None:
    job = add(daemon, "steps")
    node = attempt(daemon, job, 1)  # g5.xlarge at $0.40/h
    for eid, minutes, step in (("a1", 0, 0), ("a2", 60, 4000)):
        clock.set(T0 + timedelta(minutes=minutes))
        assert report(daemon, node, eid, minutes, step=step).status_code == 200
    with api(daemon) as client:
        plain = client.get("/offers", params={"policy": "steps"}).json()["candidates"]
        mine = client.get("/offers", params={"job": "train"}).json()["candidates"]
    # For no job: per TFLOP, the L4 (a datasheet figure) before the A10G (none), and said so.
    assert [c["offer"]["instance_type"] for c in plain] == ["g6.xlarge", "g5.xlarge"]
    assert {c["speed_source"] for c in plain} == {None}
    # For the job: 4,000 steps/h measured on g5 = $0.0001 a step.
    by_type = {c["offer"]["instance_type"]: c for c in mine}
    g5 = by_type["g5.xlarge"]
    assert (g5["speed_source"], g5["steps_per_hour"]) == ("job", pytest.approx(4000))
    assert g5["usd_per_step"] == pytest.approx(0.40 / 4000)
    # The A10G has no bf16 figure in the hardware table: nothing to scale the L4 from, so it
    # ranks after the offer whose speed is known (though cheaper per hour), saying why.
    assert [c["offer"]["instance_type"] for c in mine] == ["g5.xlarge", "g6.xlarge"]
    g6 = by_type["g6.xlarge"]
    assert (g6["speed_source"], g6["steps_per_hour"]) == (None, None)
    assert g6["speed_basis"] == "no bf16 TFLOPS to scale g5.xlarge's speed by"
    shown = cli(daemon, "offers", "--job", "train", "--explain")
    assert "steps/h" in shown and "$/1k steps" in shown and "speed from" in shown
    assert "job: the job's own 4,000 steps/h on" in shown  # wrapped in its column
