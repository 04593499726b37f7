"""The fence as the jobs layer decides it (`jobs.fence.fence_for`), which the agent API only
relays: an earlier job still running holds it past the announced power-off until the clock
margin, which lifts it with one `job.fence_lifted` event; an ended attempt never starts; a
gang's node waits for its gang."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from optimizer.jobs.fence import fence_for
from optimizer.jobs.handover import FENCE_CLOCK_MARGIN
from optimizer.model import EventKind
from optimizer.store import Store
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.jobs import Drafter
from tests.helpers.offers import T0

NOTICE = T0 + timedelta(minutes=10)
POWER_OFF = NOTICE + timedelta(seconds=120)


def handed_over(store: Store, spec: dict[str, Any] | None = None) -> int:
    """A job whose attempt 1 was interrupted (power-off announced, then silence) and whose
    attempt 2 registered and waits at the fence."""
    job = store.jobs.add_job("train", "p", spec or {"run": "x", "checkpoint_dir": "/c"}, at=T0)
    offer = make_offer(provider="aws")
    store.jobs.create_attempt(job, 1, f"{job}-1", offer, token_sha256("old"), T0)
    store.jobs.update_attempt(
        f"{job}-1", registered_at=T0, job_started_at=T0, state="ended", ended_at=NOTICE
    )
    notice = {"action": "terminate", "time": POWER_OFF.isoformat()}
    store.jobs.record_agent_events(
        f"{job}-1", [{"id": "n1", "kind": "interruption_notice", "data": notice}], NOTICE
    )
    store.jobs.update_attempt(f"{job}-1", end_reason="preempted")
    store.jobs.create_attempt(job, 2, f"{job}-2", offer, token_sha256("new"), NOTICE)
    store.jobs.update_attempt(f"{job}-2", registered_at=NOTICE)
    return job


def test_the_fence_holds_until_the_clock_margin_then_lifts_with_one_event(store: Store) -> None:
    job = handed_over(store)
    new = store.jobs.attempt(f"{job}-2")
    assert new is not None
    held = fence_for(store, Drafter(), new, now=POWER_OFF + FENCE_CLOCK_MARGIN / 2)
    assert held == "attempt 1's job has not exited yet"
    assert store.events.list_events(kind=EventKind.JOB_FENCE_LIFTED) == []

    for _ in range(2):  # asked twice: still one event
        assert fence_for(store, Drafter(), new, now=POWER_OFF + FENCE_CLOCK_MARGIN) is None
    [event] = store.events.list_events(kind=EventKind.JOB_FENCE_LIFTED)
    assert event.job_id == job and event.data is not None
    assert (event.data["attempt"], event.data["earlier_attempt"]) == (2, 1)


def test_the_fence_lifts_once_the_old_job_exits(store: Store) -> None:
    job = handed_over(store)
    store.jobs.update_attempt(f"{job}-1", exit_code=143)
    new = store.jobs.attempt(f"{job}-2")
    assert new is not None
    assert fence_for(store, Drafter(), new, now=NOTICE) is None
    assert store.events.list_events(kind=EventKind.JOB_FENCE_LIFTED) == []


BUCKET = {"run": "x", "checkpoint": {"uri": "s3://team-ckpt/r", "keep": 3, "region": "us-east-1"}}


def committed(store: Store, job: int, name: str, *, final: bool) -> None:
    """Attempt 1's agent reported a checkpoint committed to the job's bucket."""
    old = store.jobs.attempt(f"{job}-1")
    assert old is not None
    store.checkpoints.add_checkpoint(
        job_id=job,
        attempt_id=old.id,
        name=name,
        step=None,
        size_bytes=100,
        files=1,
        uri=f"s3://team-ckpt/r/data/{name}",
        provider="aws",
        region="us-east-1",
        committed_at=NOTICE,
        upload_s=1.0,
        final=final,
    )


def test_the_old_attempts_final_checkpoint_lifts_the_fence_before_it_exits(store: Store) -> None:
    job = handed_over(store, BUCKET)
    new = store.jobs.attempt(f"{job}-2")
    assert new is not None
    committed(store, job, "step-000500", final=False)  # a periodic one: the job still runs
    assert fence_for(store, Drafter(), new, now=NOTICE) == "attempt 1's job has not exited yet"
    committed(store, job, "step-000510", final=True)
    assert fence_for(store, Drafter(), new, now=NOTICE) is None
    assert store.events.list_events(kind=EventKind.JOB_FENCE_LIFTED) == []


@pytest.mark.parametrize("spec", [None, {"run": "x", "checkpoint_dir": "s3://team-ckpt/r"}])
def test_without_a_bucket_only_the_exit_lifts_the_fence(
    store: Store, spec: dict[str, Any] | None
) -> None:
    # A job whose attempts share a folder: a final report changes nothing (today's rule).
    job = handed_over(store, spec)
    committed(store, job, "step-000510", final=True)
    new = store.jobs.attempt(f"{job}-2")
    assert new is not None
    assert fence_for(store, Drafter(), new, now=NOTICE) == "attempt 1's job has not exited yet"
    store.jobs.update_attempt(f"{job}-1", exit_code=143)
    assert fence_for(store, Drafter(), new, now=NOTICE) is None


def test_an_ended_attempt_never_starts_the_job(store: Store) -> None:
    job = handed_over(store)
    store.jobs.update_attempt(f"{job}-1", exit_code=0)
    store.jobs.update_attempt(f"{job}-2", state="ended", ended_at=NOTICE, end_reason="user")
    new = store.jobs.attempt(f"{job}-2")
    assert new is not None
    assert fence_for(store, Drafter(), new, now=NOTICE) == "attempt 2 has ended (user)"


def test_a_gang_node_waits_for_every_node_to_register(store: Store) -> None:
    job = store.jobs.add_job("train", "p", {"run": "x", "checkpoint_dir": "/c"}, at=T0)
    offer = make_offer(provider="aws")
    for rank in range(2):
        key = f"{job}-1" if rank == 0 else f"{job}-1-n{rank}"
        store.jobs.create_attempt(
            job, 1 + rank, key, offer, token_sha256(key), T0, gang=1, node_rank=rank, nodes=2
        )
    store.jobs.update_attempt(f"{job}-1", registered_at=T0, address="10.0.0.1:29500")
    head = store.jobs.attempt(f"{job}-1")
    assert head is not None
    assert fence_for(store, Drafter(), head, now=T0) == "waiting for node 1 of 2 to register"
