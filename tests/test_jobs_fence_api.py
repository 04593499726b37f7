"""The fence over /agent/v1 when the old attempt goes silent: it holds past the announced
power-off, and lets the replacement start on the clock only `FENCE_CLOCK_MARGIN` after it,
with one `job.fence_lifted` warning however often the agent asks."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.jobs.handover import FENCE_CLOCK_MARGIN
from optimizer.model import EventKind
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.daemon import make_config, running
from tests.helpers.offers import T0

pytestmark = pytest.mark.usefixtures("daemon_env")

NOTICE = T0 + timedelta(minutes=10)
POWER_OFF = NOTICE + timedelta(seconds=120)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOTICE)


@pytest.fixture
def daemon(tmp_path: Path, clock: ManualClock) -> Iterator[Daemon]:
    with running(make_config(tmp_path), clock=clock) as d:
        yield d


def ask(daemon: Daemon, key: str, token: str) -> dict[str, Any]:
    """What a fenced agent's poll (an empty batch) is answered."""
    with httpx.Client(base_url=daemon.url, timeout=10) as client:
        answer = client.post(
            "/agent/v1/events",
            json={"attempt_key": key, "events": []},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_silent_old_attempt_holds_the_fence_past_its_power_off_then_the_clock_lifts_it(
    daemon: Daemon, clock: ManualClock
) -> None:
    store = daemon.store
    job = store.jobs.add_job("train", "p", {"run": "x", "checkpoint_dir": "/c"}, at=T0)
    offer = make_offer(provider="aws")
    # Attempt 1: its job runs, a notice announces the power-off, then nothing more is heard
    # (no job_exited; no instance the cloud could report gone).
    store.jobs.create_attempt(job, 1, f"{job}-1", offer, token_sha256("old"), T0)
    store.jobs.update_attempt(
        f"{job}-1", registered_at=T0, job_started_at=T0, state="ended", ended_at=NOTICE
    )
    notice = {"action": "terminate", "time": POWER_OFF.isoformat()}
    store.jobs.record_agent_events(
        f"{job}-1", [{"id": "n1", "kind": "interruption_notice", "data": notice}], NOTICE
    )
    store.jobs.update_attempt(f"{job}-1", end_reason="preempted")
    # Attempt 2: its agent registered and waits at the fence.
    store.jobs.create_attempt(job, 2, f"{job}-2", offer, token_sha256("new"), NOTICE)
    store.jobs.update_attempt(f"{job}-2", registered_at=NOTICE)

    for after in (timedelta(0), timedelta(seconds=30), FENCE_CLOCK_MARGIN - timedelta(seconds=1)):
        clock.set(POWER_OFF + after)
        assert ask(daemon, f"{job}-2", "new")["fence"] == "attempt 1's job has not exited yet"
    assert store.events.list_events(kind=EventKind.JOB_FENCE_LIFTED) == []

    clock.set(POWER_OFF + FENCE_CLOCK_MARGIN)
    assert ask(daemon, f"{job}-2", "new")["fence"] is None
    assert ask(daemon, f"{job}-2", "new")["fence"] is None  # asked again: one event still
    [event] = store.events.list_events(kind=EventKind.JOB_FENCE_LIFTED)
    assert event.severity == "warning" and event.job_id == job
    assert event.data is not None
    assert (event.data["attempt"], event.data["earlier_attempt"]) == (2, 1)
    assert event.data["power_off_at"] == POWER_OFF.isoformat()
