"""Standby start end to end on the local cloud (docs/standby.md): a real daemon, real agent
processes, the example job shipped as code with `standby: true`. After an interruption the
replacement's job starts while the old one still trains; the old job gets its stop only once
the new one says it waits; the new job gets its go after the old job's final checkpoint, and
carries on from the very next step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from optimizer.clock import Clock, SteadyClock
from optimizer.daemon.service import Daemon
from providers.local import LocalCloud
from tests.helpers import wait_until
from tests.helpers.cloud import local_cloud
from tests.helpers.daemon import api
from tests.helpers.jobs import MID_MONTH, e2e_daemon, job_body, running_instance

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]


@pytest.fixture
def clock() -> Clock:
    return SteadyClock(MID_MONTH)


@pytest.fixture
def cloud(tmp_path: Path, clock: Clock) -> Iterator[LocalCloud]:
    """A power-off 60 s after a notice: the handover is the replacement's readiness, not the
    clock's."""
    with local_cloud(
        tmp_path / "local-cloud",
        grace_s=60.0,
        terminate_grace_s=2.0,
        tick_s=0.05,
        clock=lambda: clock().timestamp(),
    ) as local:
        yield local


@pytest.fixture
def daemon(
    tmp_path: Path, cloud: LocalCloud, httpserver: HTTPServer, clock: Clock
) -> Iterator[Daemon]:
    with e2e_daemon(tmp_path, cloud, httpserver, clock) as d:
        yield d


def steps_of(log: Path, attempt: int) -> list[dict[str, Any]]:
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return []
    found = [json.loads(line) for line in lines if line.endswith("}")]
    return [x for x in found if x["attempt"] == str(attempt)]


def test_the_replacement_starts_in_standby_and_takes_over_at_the_next_step(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    log = tmp_path / "steps.jsonl"
    body = job_body("warm", tmp_path / "bucket", 100_000, standby=True, env={"STEP_LOG": str(log)})
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code in (200, 201)
    wait_until(lambda: len(steps_of(log, 1)) >= 10, 120, "attempt 1's steps")
    instance = running_instance(cloud, "warm", 1)
    assert instance is not None
    cloud.interrupt(instance)
    wait_until(lambda: steps_of(log, 2), 120, "attempt 2's first step")

    job = daemon.store.jobs.get_job("warm")
    assert job is not None
    old, new = (daemon.store.jobs.attempt(f"{job.id}-{n}") for n in (1, 2))
    assert old is not None and new is not None

    def event(key: str, kind: str, **data: Any) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next(
                (
                    e
                    for e in daemon.store.jobs.agent_events(key)
                    if e["kind"] == kind and all(e["data"].get(k) == v for k, v in data.items())
                ),
                None,
            )

        return wait_until(found, 60, f"{kind} {data} from {key}")

    ready = event(new.key, "standby_ready", exited=False)
    old = daemon.store.jobs.attempt(old.key)
    assert old is not None
    started = event(new.key, "job_started")
    final = event(old.key, "checkpoint_committed", final=True)
    # The old job trained on until the new one said it waited, and only then got its stop.
    assert old.stop_sent_at is not None and ready["at"] <= old.stop_sent_at
    assert started["data"]["standby"] is True
    # The go came after the old job's final checkpoint: the new job loaded that one.
    assert started["at"] >= final["at"]
    before, after = steps_of(log, 1), steps_of(log, 2)
    assert after[0]["step"] == before[-1]["step"] + 1  # no step lost, none done twice
    assert after[0]["t"] > before[-1]["t"]  # never two at once
