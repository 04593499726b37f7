"""Managed jobs end to end on the local cloud: the policy, job bodies, an in-process daemon
with a signed webhook, and reading the world's state (instances, checkpoints, alerts).

Used by the jobs' end-to-end tests (the migration ones included) and the leader-election tests.
A module of them takes the fixtures `clock`, `cloud` and `daemon` as its own with
`clock, cloud, daemon = E2E_FIXTURES`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from optimizer.alerts.webhook import verify_signature
from optimizer.clock import Clock, SteadyClock
from optimizer.daemon.service import Daemon
from optimizer.model import EventKind
from optimizer.store import NewEvent
from optimizer.ui import console_app
from providers.local import LocalCloud
from tests.helpers.cloud import local_cloud
from tests.helpers.code import code_ref, ship
from tests.helpers.daemon import api, make_config, running
from tests.helpers.policies import write_policy
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: local-eu
workload: {gpus: 1, gpu_memory_gib: 12}
markets: [spot, on_demand]
placement: {providers: [local], compliance: eu}
recovery: {max_restarts: 5, pool_cooldown_minutes: 10, on_demand_after_interruptions: 5}
"""
SECRET = "hook-secret-for-the-e2e-test"
MID_MONTH = datetime(2026, 3, 14, 12, 0, tzinfo=UTC)
"""Where the end-to-end tests' clocks start (a SteadyClock): mid-month, so that month-to-date
spend, budgets and projections come out the same on any day the suite runs."""


def job_body(name: str, ckpt: Path, steps: int, **extra: Any) -> dict[str, Any]:
    """A job of the `local-eu` policy running examples/train_with_checkpoints.py as on a real
    cloud: from the examples/ folder shipped as its code (`tests.helpers.code`; e2e_daemon
    holds it), its checkpoints synced to the bucket `file://<ckpt>`, restored into the
    instance's own disk by each attempt. A `checkpoint_dir` in `extra` replaces the bucket: a
    folder every attempt shares, for a test that reads what the job writes there as it runs."""
    body = {
        "name": name,
        "policy": "local-eu",
        "code": code_ref(),
        "run": (
            f"python train_with_checkpoints.py --engine numpy --steps {steps} "
            "--checkpoint-every 5 --step-sleep 0.02 --log-every 100"
        ),
        "checkpoint": bucket(ckpt),
        "probes": "none",
    }
    if "checkpoint_dir" in extra:
        del body["checkpoint"]
    body.update(extra)
    return body


def bucket(folder: Path) -> str:
    """The URI of a local 'bucket' (object storage semantics) held in `folder`."""
    return f"file://{folder.resolve()}"


@contextmanager
def e2e_cloud(tmp_path: Path, clock: Clock) -> Iterator[LocalCloud]:
    """The local cloud of the end-to-end tests: short graces, fast ticks, on `clock`."""
    with local_cloud(
        tmp_path / "local-cloud",
        grace_s=1.5,
        terminate_grace_s=2.0,
        tick_s=0.05,
        clock=lambda: clock().timestamp(),
    ) as cloud:
        yield cloud


@contextmanager
def e2e_daemon(
    tmp_path: Path, cloud: LocalCloud, httpserver: HTTPServer, clock: Clock
) -> Iterator[Daemon]:
    """A running daemon on `cloud` with the `local-eu` policy, reconciling every 0.25 s, its
    job.* alerts sent to `httpserver`'s /hook signed with SECRET; offers polled once and the
    examples/ folder uploaded as code (job_body's)."""
    httpserver.expect_request("/hook").respond_with_data("ok")
    write_policy(tmp_path / "policies", "local-eu.yaml", POLICY)
    config = make_config(
        tmp_path,
        policy_dir=tmp_path / "policies",
        loops={"reconcile_s": 0.25},
        alerts={
            "channels": {
                "hook": {"type": "webhook", "url": httpserver.url_for("/hook"), "secret": SECRET}
            },
            "routes": [{"kinds": ["job.*"], "channels": ["hook"]}],
        },
    )
    # with the console, as a team runs it (the console's pages over live jobs are checked too)
    with running(config, sources={"local": cloud}, clock=clock, face=console_app) as d:
        for poll in d.polls:  # offers in the store before the first job
            poll.run_once()
        ship(d)  # the examples/ folder job_body runs
        yield d


def polls_and_passes(daemon: Daemon, polls: int, poll_s: float) -> None:
    """Wait for `polls` more polls of the local cloud's spot prices (every `poll_s`), each
    followed by a reconcile pass."""
    ran = daemon.metrics.loop_runs.labels("reconcile", "ok")
    polled = daemon.metrics.loop_runs.labels("poll:local:spot", "ok")
    want_polls, want_passes = polled._value.get() + polls, ran._value.get() + polls
    wait_until(
        lambda: polled._value.get() >= want_polls and ran._value.get() >= want_passes,
        30 + 3 * polls * poll_s,
        f"{polls} polls and reconcile passes",
    )


@pytest.fixture
def _clock() -> Clock:
    """The clock of the daemon, the local cloud and its machines: from MID_MONTH at the wall
    clock's pace. A test that needs another start parametrizes `clock`."""
    return SteadyClock(MID_MONTH)


@pytest.fixture
def _cloud(tmp_path: Path, clock: Clock) -> Iterator[LocalCloud]:
    with e2e_cloud(tmp_path, clock) as local:
        yield local


@pytest.fixture
def _daemon(
    tmp_path: Path, cloud: LocalCloud, httpserver: HTTPServer, clock: Clock
) -> Iterator[Daemon]:
    with e2e_daemon(tmp_path, cloud, httpserver, clock) as d:
        yield d


E2E_FIXTURES = (_clock, _cloud, _daemon)
"""`clock`, `cloud` (e2e_cloud) and `daemon` (e2e_daemon), for a module to bind under those
names: pytest names a fixture after the module attribute that holds it."""


def state_of(daemon: Daemon, name: str) -> dict[str, Any]:
    with api(daemon) as client:
        return client.get(f"/jobs/{name}").json()


def running_instance(cloud: LocalCloud, job: str, attempt: int) -> str | None:
    for record in cloud.instances():
        if record.state == "running" and record.key.endswith(f"-{attempt}"):
            return record.id
    return None


def running_instance_id(cloud: LocalCloud, instance_id: str) -> bool:
    return any(r.id == instance_id and r.state == "running" for r in cloud.instances())


def _committed(ckpt: Path) -> list[tuple[int, Path]]:
    """(step, folder) of each committed checkpoint the example wrote to `ckpt`: a shared
    folder (`step-N/` holding its marker) or a file:// bucket (a manifest under
    `manifests/`, the files under `data/<name>/`), highest step first."""
    found = [
        (int(m.parent.name.split("-")[1]), m.parent) for m in ckpt.glob("step-*/.gpuopt-committed")
    ]
    for manifest in ckpt.glob("manifests/*.json"):
        try:
            step = json.loads(manifest.read_text())["step"]
        except (OSError, ValueError, KeyError):  # being written: not there yet
            continue
        found.append((int(step), ckpt / "data" / manifest.stem))
    return sorted(found, reverse=True)


def committed_steps(ckpt: Path) -> list[int]:
    """The steps of the committed checkpoints in `ckpt`, highest first (step 0 included: a
    job stopped before its first step still saves one)."""
    return [step for step, _ in _committed(ckpt)]


def latest_step(ckpt: Path) -> int:
    """The step of the newest committed checkpoint in `ckpt` (0: none yet)."""
    return max((step for step, _ in _committed(ckpt)), default=0)


def done_summary(ckpt: Path) -> dict[str, Any]:
    """The example's run summary (`done.json`), from its last checkpoint in `ckpt`."""
    for _, folder in _committed(ckpt):
        if (folder / "done.json").is_file():
            return dict(json.loads((folder / "done.json").read_text()))
    raise AssertionError(f"no checkpoint in {ckpt} holds done.json")


def hook_alerts(httpserver: HTTPServer) -> list[dict[str, Any]]:
    """Every alert the webhook received, each signature checked."""
    out = []
    for request, _ in httpserver.log:
        body = request.get_data()
        assert verify_signature(
            SECRET,
            request.headers["X-Gpuopt-Timestamp"],
            body,
            request.headers["X-Gpuopt-Signature"],
            now=float(request.headers["X-Gpuopt-Timestamp"]),
        )
        out.append(json.loads(body))
    return out


class Drafter:
    """The reconcile context's event drafter without the alert router: events as recorded."""

    def draft(
        self,
        kind: EventKind,
        message: str,
        *,
        severity: str = "info",
        policy: str | None = None,
        job_id: int | None = None,
        data: Mapping[str, Any] | None = None,
        dedupe_key: str | None = None,
    ) -> NewEvent:
        return NewEvent(kind, message, severity, job_id, policy, data, (), dedupe_key)
