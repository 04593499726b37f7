"""Utilization rules and max_duration end to end on the local cloud: a real daemon, real agent
processes running the example training job, alerts through a webhook on loopback.

The job specs carry the rules (a spec's rules override its policy's), with 10 s windows. The
local cloud injects the GPU readings (`LocalCloud.inject_telemetry`, what `gpuopt local
telemetry` writes) and the real agent reports them as it would NVML's, per minute, with the
minute in progress reported live. "Within the window plus one reconcile interval" is measured
from when the stored readings first make the rule true (the test watches the store) to the
stop, and the stop comes no earlier than the window after the job started.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from optimizer.daemon.service import Daemon
from optimizer.jobs.utilization import Rule, below_for
from optimizer.jobs.watch import gpu_samples
from optimizer.model import EventKind
from providers.local import LocalCloud
from tests.helpers import api, wait_until
from tests.helpers.jobs import (
    E2E_FIXTURES,
    committed_steps,
    hook_alerts,
    job_body,
    latest_step,
    running_instance,
    running_instance_id,
    state_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]
RECONCILE_S = 0.25  # e2e_daemon's reconcile interval


clock, cloud, daemon = E2E_FIXTURES


def alerts_of(httpserver: HTTPServer, kind: EventKind) -> list[dict[str, Any]]:
    return [a for a in hook_alerts(httpserver) if a.get("kind") == kind.value]


def test_max_duration_stops_the_job_with_its_checkpoint_written(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, httpserver: HTTPServer
) -> None:
    ckpt = tmp_path / "ckpt"
    body = job_body("long", ckpt, steps=1_000_000, max_duration="40s")
    # No periodic checkpoint: the one the job writes is the one its SIGTERM asks for.
    body["run"] = body["run"].replace("--checkpoint-every 5", "--checkpoint-every 10000000")
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    instance = wait_until(lambda: running_instance(cloud, "long", 1), 30, "attempt 1 running")
    wait_until(lambda: state_of(daemon, "long")["state"] == "stopped", 70, "the stop")
    job = state_of(daemon, "long")
    assert job["reason"].startswith("stopped by max_duration: ran its max_duration of 40s")
    # SIGTERM → checkpoint → exit; then the instance is terminated.
    # (40 s: the job takes some steps after importing torch, which alone may take 20 s on a
    # loaded machine.)
    saved = wait_until(lambda: committed_steps(ckpt) or None, 30, "the checkpoint in the bucket")
    assert latest_step(ckpt) > 0, saved
    wait_until(lambda: not running_instance_id(cloud, instance), 30, "the instance to go")
    # (The cloud shows the instance gone a moment before the reconciler records its call.)
    [attempt] = wait_until(
        lambda: [a for a in daemon.store.jobs.attempts(job["id"]) if a.terminated_by] or None,
        10,
        "the terminate call recorded",
    )
    assert attempt.end_reason == "stopped" and attempt.exit_code == 143
    assert attempt.terminated_by == "gpuopt"
    # Stopped within max_duration plus a reconcile pass (and a little for a loaded machine)
    # of the job's start.
    assert attempt.job_started_at is not None and attempt.ended_at is not None
    ran = attempt.ended_at - attempt.job_started_at
    assert timedelta(seconds=40) <= ran <= timedelta(seconds=40 + RECONCILE_S + 1.0), ran
    [alert] = wait_until(
        lambda: alerts_of(httpserver, EventKind.JOB_STOPPED) or None, 10, "the alert"
    )
    assert alert["job"] == "long" and alert["data"]["rule"] == "max_duration"
    assert alert["severity"] == "warning"


def rule_true(daemon: Daemon, job_id: int, rule: Rule) -> datetime | None:
    """Now, if the stored readings of the job's first attempt make `rule` true now."""
    attempts = daemon.store.jobs.attempts(job_id)
    if not attempts or attempts[0].job_started_at is None:
        return None
    a = attempts[0]
    assert a.job_started_at is not None
    now = daemon.clock()
    samples = gpu_samples(daemon.store, a.id, since=a.job_started_at - timedelta(minutes=2))
    fired = below_for(samples, rule, started_at=a.job_started_at, now=now)
    return now if fired is not None else None


def test_an_idle_job_is_stopped_within_the_window_plus_a_reconcile_pass(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, httpserver: HTTPServer
) -> None:
    ckpt = tmp_path / "ckpt"
    idle = {"below": 0.05, "for": "10s", "action": "stop"}
    body = job_body("idle", ckpt, steps=1_000_000, utilization={"idle": idle})
    with api(daemon) as client:
        created = client.post("/jobs", json=body)
        assert created.status_code == 201
    job_id = created.json()["id"]
    instance = wait_until(lambda: running_instance(cloud, "idle", 1), 30, "attempt 1 running")
    cloud.inject_telemetry(instance, util=0.03, memory=0.2, interval_s=1)
    rule = Rule("idle", 0.05, timedelta(seconds=10), "stop")
    true_at = wait_until(lambda: rule_true(daemon, job_id, rule), 150, "readings covering 10 s")
    wait_until(lambda: state_of(daemon, "idle")["state"] == "stopped", 10, "the stop")
    [attempt] = daemon.store.jobs.attempts(job_id)
    assert attempt.ended_at is not None and attempt.job_started_at is not None
    # Within one reconcile pass of the readings that make the rule true (and some slack for
    # a loaded machine); the test saw them no earlier than the daemon could.
    assert attempt.ended_at - true_at <= timedelta(seconds=RECONCILE_S + 1.0)
    # And no earlier than the window after the job started.
    assert attempt.ended_at - attempt.job_started_at >= timedelta(seconds=10)
    job = state_of(daemon, "idle")
    assert job["reason"].startswith("stopped by idle: GPU utilization below 5% for 10s")
    assert attempt.end_reason == "stopped"
    wait_until(lambda: not running_instance_id(cloud, instance), 30, "the instance to go")
    wait_until(lambda: committed_steps(ckpt) or None, 10, "the stop's checkpoint in the bucket")
    [alert] = wait_until(
        lambda: alerts_of(httpserver, EventKind.JOB_STOPPED) or None, 10, "the alert"
    )
    assert alert["job"] == "idle" and alert["data"]["rule"] == "idle"
    assert daemon.store.events.list_events(kind=EventKind.JOB_STOPPED, job_id=job_id)


def test_a_job_at_40_percent_raises_the_low_alert_once_per_window(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, httpserver: HTTPServer
) -> None:
    ckpt = tmp_path / "ckpt"
    low = {"below": 0.60, "for": "10s", "action": "alert"}
    body = job_body("low", ckpt, steps=1_000_000, utilization={"low": low})
    with api(daemon) as client:
        created = client.post("/jobs", json=body)
        assert created.status_code == 201
    job_id = created.json()["id"]
    instance = wait_until(lambda: running_instance(cloud, "low", 1), 30, "attempt 1 running")
    cloud.inject_telemetry(instance, util=0.4, memory=0.5, interval_s=1)
    alerts = wait_until(
        lambda: (a := alerts_of(httpserver, EventKind.JOB_UNDERUSED))[2:] and a,
        150,
        "three windows' alerts",
    )
    first = alerts[0]
    assert first["data"]["rule"] == "low" and first["data"]["peak"] == pytest.approx(0.4)
    assert first["severity"] == "warning" and first["job"] == "low"
    assert state_of(daemon, "low")["state"] == "running"  # an alert rule never stops
    # Once per window: every alert has its own 10 s window, none overlapping the one before,
    # and the store holds exactly the alerts the webhook received (each window alerted once).
    windows = [
        (datetime.fromisoformat(a["data"]["window_start"]), a["data"]["window_end"])
        for a in alerts_of(httpserver, EventKind.JOB_UNDERUSED)
    ]
    assert len(windows) == len(set(windows)) >= 3
    ends = [datetime.fromisoformat(end) for _, end in windows]
    for (start, end), before in zip(windows[1:], ends, strict=False):
        assert start >= before  # back to back at most, never overlapping
        assert datetime.fromisoformat(end) - start == timedelta(seconds=10)
    events = daemon.store.events.list_events(kind=EventKind.JOB_UNDERUSED, job_id=job_id)
    assert len(events) >= len(windows)
    assert len({e.data["window_start"] for e in events if e.data}) == len(events)
