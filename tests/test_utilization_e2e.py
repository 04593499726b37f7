"""Utilization rules and max_duration end to end on the local cloud: a real daemon, real agent
processes running the example training job, alerts through a webhook on loopback.

The job specs carry the rules (a spec's rules override its policy's), with short windows so
each test takes seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from optimizer.clock import Clock, utc_now
from optimizer.daemon.service import Daemon
from optimizer.model import EventKind
from providers.local import LocalCloud
from tests.helpers import api, wait_until
from tests.helpers.jobs import (
    e2e_cloud,
    e2e_daemon,
    hook_alerts,
    job_body,
    latest_step,
    running_instance,
    running_instance_id,
    state_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]
RECONCILE_S = 0.25  # e2e_daemon's reconcile interval


@pytest.fixture
def clock() -> Clock:
    return utc_now


@pytest.fixture
def cloud(tmp_path: Path, clock: Clock) -> Iterator[LocalCloud]:
    with e2e_cloud(tmp_path, clock) as local:
        yield local


@pytest.fixture
def daemon(
    tmp_path: Path, cloud: LocalCloud, httpserver: HTTPServer, clock: Clock
) -> Iterator[Daemon]:
    with e2e_daemon(tmp_path, cloud, httpserver, clock) as d:
        yield d


def alerts_of(httpserver: HTTPServer, kind: EventKind) -> list[dict[str, Any]]:
    return [a for a in hook_alerts(httpserver) if a.get("kind") == kind.value]


def test_max_duration_stops_the_job_with_its_checkpoint_written(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, httpserver: HTTPServer
) -> None:
    ckpt = tmp_path / "ckpt"
    body = job_body("long", ckpt, steps=1_000_000, max_duration="20s")
    # No periodic checkpoint: the one the job writes is the one its SIGTERM asks for.
    body["run"] = body["run"].replace("--checkpoint-every 5", "--checkpoint-every 10000000")
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    instance = wait_until(lambda: running_instance(cloud, "long", 1), 30, "attempt 1 running")
    wait_until(lambda: state_of(daemon, "long")["state"] == "stopped", 40, "the stop")
    job = state_of(daemon, "long")
    assert job["reason"].startswith("stopped by max_duration: ran its max_duration of 20s")
    # SIGTERM → checkpoint → exit; then the instance is terminated.
    # (20 s: the job takes some steps after importing torch on a loaded machine.)
    [saved] = wait_until(lambda: list(ckpt.glob("ckpt-*.pt")) or None, 30, "the checkpoint")
    assert latest_step(ckpt) > 0, saved
    wait_until(lambda: not running_instance_id(cloud, instance), 30, "the instance to go")
    [attempt] = daemon.store.jobs.attempts(job["id"])
    assert attempt.end_reason == "stopped" and attempt.exit_code == 143
    assert attempt.terminated_by == "gpuopt"
    # Stopped within max_duration plus a reconcile pass (and a little for a loaded machine)
    # of the job's start.
    assert attempt.job_started_at is not None and attempt.ended_at is not None
    ran = attempt.ended_at - attempt.job_started_at
    assert timedelta(seconds=20) <= ran <= timedelta(seconds=20 + RECONCILE_S + 1.0), ran
    [alert] = wait_until(
        lambda: alerts_of(httpserver, EventKind.JOB_STOPPED) or None, 10, "the alert"
    )
    assert alert["job"] == "long" and alert["data"]["rule"] == "max_duration"
    assert alert["severity"] == "warning"
