"""A job with `warm_spare: true` on the local cloud: a real daemon, real agents, real jobs.

The job runs on one instance while a second one, its warm spare, is booted, registered and
probed and then idles at the fence; an interruption notice on the running instance hands the
job to the spare (no launch, no boot, no probe) and a new spare is launched; the spares'
instance time is in the ledger as their own lines; a cancel ends the job and its spare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from optimizer.daemon.service import Daemon
from optimizer.model import EventKind
from optimizer.store.jobs import AttemptRecord
from providers.local import LocalCloud
from tests.helpers import api, wait_until
from tests.helpers.jobs import E2E_FIXTURES, job_body, latest_step, running_instance_id, state_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]


clock, cloud, daemon = E2E_FIXTURES


def _rows(daemon: Daemon, job_id: int) -> list[AttemptRecord]:
    return daemon.store.jobs.attempts(job_id)


def _spare(daemon: Daemon, job_id: int) -> AttemptRecord | None:
    """The job's idle spare, once registered and probed (None: not yet)."""
    return next(
        (
            a
            for a in _rows(daemon, job_id)
            if a.idle_spare and not a.ended and a.probe_status in ("pass", "warn")
        ),
        None,
    )


def _attempts(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    return list(state_of(daemon, name)["attempts"])


def test_a_warm_spare_takes_the_job_over_without_a_launch_and_is_replaced(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    ckpt = tmp_path / "ckpt"
    body = job_body("spare", ckpt, steps=100_000, probes="quick", warm_spare=True)
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    job_id = state_of(daemon, "spare")["id"]

    # Two instances: one runs the job, the other is registered, probed and idle.
    spare = wait_until(lambda: _spare(daemon, job_id), 240, "a registered, probed spare")
    running = wait_until(
        lambda: next((a for a in _rows(daemon, job_id) if a.job_started_at and not a.ended), None),
        240,
        "the job running",
    )
    assert running.key != spare.key and not running.spare
    assert spare.job_started_at is None and spare.registered_at is not None
    assert running_instance_id(cloud, spare.instance_id or "")
    # apart from the running attempt: another zone (or an on-demand pool, never reclaimed)
    assert (spare.region, spare.zone) != (running.region, running.zone)
    shown = {a["number"]: a for a in _attempts(daemon, "spare")}
    assert shown[spare.number]["role"] == "warm_spare"
    assert shown[running.number]["role"] == "job"
    assert shown[spare.number]["probe_status"] in ("pass", "warn")
    wait_until(lambda: latest_step(ckpt) >= 10, 60, "a first checkpoint")
    # Its agent waits at the fence for as long as it is a spare: it never starts the job.
    assert (daemon.store.jobs.attempt(spare.key) or spare).job_started_at is None

    # The notice: the spare takes the job over, as it is (same instance, no new probe).
    launched = {a.key for a in _rows(daemon, job_id)}
    noticed = cloud.interrupt(running.instance_id or "", grace_s=30).interruption
    assert noticed is not None
    took = wait_until(
        lambda: (a := daemon.store.jobs.attempt(spare.key)) and a.job_started_at and a,
        90,
        "the spare starting the job",
    )
    assert took.promoted_at is not None and not took.idle_spare
    assert took.instance_id == spare.instance_id and took.registered_at == spare.registered_at
    assert took.number > running.number  # the job's newest attempt: the fence held it
    old = daemon.store.jobs.attempt(running.key)
    assert old is not None and old.end_reason == "preempted"
    assert old.exit_code is not None  # the old job exited before the spare started it
    # No launch for the takeover: every attempt but one new spare was there before.
    new = wait_until(lambda: _spare(daemon, job_id), 240, "a new spare")
    added = {a.key for a in _rows(daemon, job_id)} - launched
    assert added == {new.key} and new.key != spare.key
    promoted = daemon.store.events.list_events(kind=EventKind.JOB_SPARE_CHANGED, job_id=job_id)
    actions = [(e.data or {}).get("action") for e in promoted]
    assert actions.count("launched") == 2 and actions.count("promoted") == 1

    # The ledger prices the new spare's time as a warm spare's line; the old spare's time is
    # now the job's (its wait before the takeover is that attempt's overhead).
    shown = {a["number"]: a for a in _attempts(daemon, "spare")}
    assert shown[new.number]["role"] == "warm_spare"
    assert shown[took.number]["role"] == "job"
    lines = wait_until(
        lambda: (ls := shown_lines(daemon, new.number)) and ls[0]["billed_seconds"] > 0 and ls,
        30,
        "the spare's cost line",
    )
    assert lines[0]["spend_usd"] > 0

    # A spare that is itself interrupted is ended and replaced; the job runs on untouched.
    cloud.interrupt(new.instance_id or "", grace_s=30)
    gone = wait_until(
        lambda: (a := daemon.store.jobs.attempt(new.key)) and a.ended and a, 60, "its end"
    )
    assert gone.end_reason == "preempted" and gone.job_started_at is None
    again = wait_until(lambda: _spare(daemon, job_id), 240, "another spare")
    assert again.key not in {new.key, took.key} and again.pool != new.pool
    still = daemon.store.jobs.attempt(took.key)
    assert still is not None and not still.ended and still.exit_code is None
    assert state_of(daemon, "spare")["restarts"] == 1  # a spare's end is not the job's
    new = again

    # A cancel ends the job and its spare.
    with api(daemon) as client:
        assert client.post("/jobs/spare/cancel").status_code == 200
    wait_until(lambda: state_of(daemon, "spare")["state"] == "cancelled", 60, "the cancel")
    ended = wait_until(
        lambda: all(a.ended for a in _rows(daemon, job_id)) and _rows(daemon, job_id),
        60,
        "every attempt ended",
    )
    assert next(a for a in ended if a.key == new.key).end_reason == "spare_released"
    for a in ended:
        wait_until(
            lambda i=a.instance_id: not running_instance_id(cloud, i or ""),
            60,
            f"attempt {a.number}'s instance gone",
        )


def shown_lines(daemon: Daemon, number: int) -> list[dict[str, Any]]:
    found = next(a for a in _attempts(daemon, "spare") if a["number"] == number)
    return list(found["cost_lines"])
