"""Standby start in the daemon (docs/standby.md): an interrupted attempt's job keeps training
until its replacement's job, started in standby, has started up (its agent's `standby_ready`),
within a bound; the power-off less the allowance still stops it in time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from optimizer.daemon.service import Daemon
from optimizer.jobs.handover import handover
from optimizer.jobs.machine import Stop
from optimizer.jobs.standby import STANDBY_READY_WAIT, standby_ready
from optimizer.store import Store
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.code_api import POLICY, SPEC, attempt
from tests.helpers.daemon import make_config, running, without_job_passes
from tests.helpers.machine_views import NOW
from tests.helpers.machine_views import attempt as view
from tests.helpers.offers import T0
from tests.helpers.policies import write_policy

NOTICE = T0 + timedelta(minutes=10)


def test_the_old_job_runs_on_until_the_job_in_standby_is_ready() -> None:
    old = view(interruption_notice_at=NOW, power_off_at=NOW + timedelta(minutes=2))
    starting = view(number=2, key="7-2", standby_ready=False)
    ready = Stop("7-1", "interrupted; attempt 2 is ready to take over")
    assert handover(old, starting, now=NOW, probes="quick") is None
    assert handover(old, replace(starting, standby_ready=True), now=NOW, probes="quick") == ready
    # The power-off less the allowance stops it all the same.
    near = handover(old, starting, now=NOW + timedelta(seconds=100), probes="quick")
    assert near == Stop("7-1", "interrupted; the power-off is near")


def test_ready_is_the_agents_report_or_the_bound_after_registration(store: Store) -> None:
    job = store.jobs.add_job("train", "p", {"run": "x", "checkpoint_dir": "/c"}, at=T0)
    store.jobs.create_attempt(job, 2, f"{job}-2", make_offer(), token_sha256("new"), NOTICE)
    new = store.jobs.attempt(f"{job}-2")
    assert new is not None
    assert not standby_ready(store, new, now=NOTICE)  # not even registered
    store.jobs.update_attempt(f"{job}-2", registered_at=NOTICE)
    new = store.jobs.attempt(f"{job}-2")
    assert new is not None
    assert not standby_ready(store, new, now=NOTICE + timedelta(seconds=5))
    assert standby_ready(store, new, now=NOTICE + STANDBY_READY_WAIT)  # never said: bounded
    ready = {"id": "r1", "kind": "standby_ready", "data": {"exited": False, "startup_s": 3.1}}
    store.jobs.record_agent_events(f"{job}-2", [ready], NOTICE + timedelta(seconds=4))
    assert standby_ready(store, new, now=NOTICE + timedelta(seconds=5))
    assert standby_ready(store, replace(new, nodes=2, registered_at=None), now=NOTICE)  # a gang


@pytest.fixture
def daemon(tmp_path: Path, daemon_env: None) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "p.yaml", POLICY)
    with running(make_config(tmp_path / "data", policy_dir=tmp_path / "policies")) as d:
        without_job_passes(d)  # the test plays the job's agents
        yield d


def test_the_register_answer_carries_standby_only_for_a_job_that_asks(daemon: Daemon) -> None:
    answers = {}
    for name, spec in (("plain", SPEC), ("warm", {**SPEC, "standby": True})):
        job = daemon.store.jobs.add_job(name, "p", spec, at=T0)
        token = attempt(daemon, job, 1)
        with httpx.Client(base_url=daemon.url, timeout=30) as client:
            answer = client.post(
                "/agent/v1/register",
                json={"attempt_key": f"{job}-1", "instance_id": "i-1"},
                headers={"Authorization": f"Bearer {token}"},
            )
        assert answer.status_code == 200, answer.text
        answers[name] = answer.json()["job"]
    assert "standby" not in answers["plain"]
    assert answers["warm"]["standby"] is True
