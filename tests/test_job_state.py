"""A job's state as the ranking and the ledger read it from the store: the newest checkpoint
still in its bucket (an empty state at the bucket's region before the first), the restore
throughput its last restore measured, the horizon left of its max_duration; and the ledger's
storage and egress lines from the same rows, equal to a hand computation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from optimizer.jobs.ledger import state_lines_for
from optimizer.jobs.ranking import job_state
from optimizer.store import Store
from optimizer.store.costs import LineFilter
from optimizer.store.jobs import token_sha256
from policies.egress import DEFAULT_HORIZON_HOURS, storage_usd_per_gb_month, transfer_usd_per_gb
from tests.helpers import make_offer
from tests.helpers.offers import T0

GIB = 2**30


def add_job(store: Store, **spec: Any) -> tuple[int, list[int]]:
    body = {"run": "x", "checkpoint": {"uri": "s3://bkt/r", "keep": 3, "region": "eu-central-1"}}
    body.update(spec)
    job = store.jobs.add_job("train", "p", body, at=T0)
    attempts = []
    for number in (1, 2):
        key = f"{job}-{number}"
        attempts.append(
            store.jobs.create_attempt(
                job, number, key, make_offer(provider="aws"), token_sha256(key), T0
            ).id
        )
    return job, attempts


def commit(store: Store, job: int, attempt: int, name: str, size: int, at_s: float) -> None:
    store.checkpoints.add_checkpoint(
        job_id=job,
        attempt_id=attempt,
        name=name,
        step=int(name.split("-")[1]),
        size_bytes=size,
        files=2,
        uri=f"s3://bkt/r/data/{name}",
        provider="aws",
        region="eu-central-1",
        committed_at=T0 + timedelta(seconds=at_s),
        upload_s=2.0,
        final=False,
    )


def restore(store: Store, job: int, attempt: int, fetched: int, seconds: float, at_s: float):  # type: ignore[no-untyped-def]
    store.checkpoints.add_restore(
        job_id=job,
        attempt_id=attempt,
        checkpoint_name="step-10",
        size_bytes=fetched,
        fetched_bytes=fetched,
        seconds=seconds,
        from_provider="aws",
        from_region="eu-central-1",
        to_provider="gcp",
        to_region="us-central1",
        at=T0 + timedelta(seconds=at_s),
    )


def test_a_job_without_a_bucket_has_no_state(store: Store) -> None:
    job = store.jobs.add_job("plain", "p", {"run": "x", "checkpoint_dir": "/x"}, at=T0)
    assert job_state(store, job, T0) is None


def test_before_its_first_checkpoint_the_state_is_empty_at_the_buckets_region(
    store: Store,
) -> None:
    job, _ = add_job(store)
    state = job_state(store, job, T0)
    assert state is not None
    assert (state.provider, state.region, state.size_bytes) == ("aws", "eu-central-1", 0)
    assert state.restore_mib_s is None and state.horizon_hours == DEFAULT_HORIZON_HOURS


def test_a_bucket_of_unknown_region_gives_no_state_until_a_checkpoint_says(store: Store) -> None:
    job, _ = add_job(store, checkpoint={"uri": "s3://bkt/r", "keep": 3, "region": None})
    assert job_state(store, job, T0) is None


def test_the_newest_live_checkpoint_and_the_last_measured_restore_make_the_state(
    store: Store,
) -> None:
    job, (first, second) = add_job(store, max_duration=10 * 3600.0)
    commit(store, job, first, "step-10", 3 * GIB, 10)
    commit(store, job, first, "step-20", 5 * GIB, 20)
    store.checkpoints.mark_deleted(job, ["step-20"], T0 + timedelta(seconds=30))
    restore(store, job, first, 2 * GIB, 8.0, 40)  # 256 MiB/s
    restore(store, job, second, 2 * GIB, 16.0, 50)  # 128 MiB/s, the newer
    state = job_state(store, job, T0 + timedelta(hours=4))
    assert state is not None
    # step-20 was pruned: step-10 is what a replacement would fetch
    assert state.size_bytes == 3 * GIB
    assert state.restore_mib_s == pytest.approx(128.0)
    # Both attempts have run since T0, overlapping (a handover): 4 h ran, 6 h are left
    assert state.horizon_hours == pytest.approx(6.0)


def test_the_ledger_prices_the_rows_as_a_hand_computation(store: Store) -> None:
    job, (first, second) = add_job(store)
    commit(store, job, first, "step-10", 4 * 10**9, 0)
    store.checkpoints.mark_deleted(job, ["step-10"], T0 + timedelta(days=10))
    restore(store, job, second, 3 * 10**9, 30.0, 60)
    lines = state_lines_for(store, LineFilter(job_id=job), T0 + timedelta(days=20))
    by_kind = {line.market: line for line in lines}
    storage_rate = storage_usd_per_gb_month("aws", "eu-central-1")
    hours_per_month = 730
    want_storage = 4 * (10 * 24 / hours_per_month) * storage_rate
    egress_rate = transfer_usd_per_gb("aws", "eu-central-1", "gcp", "us-central1").usd_per_gb
    want_egress = 3 * egress_rate
    storage = [line for line in lines if line.cost.network_usd == 0]
    egress = [line for line in lines if line.cost.network_usd > 0]
    assert len(storage) == 1 and len(egress) == 1, by_kind
    assert storage[0].cost.total_usd == pytest.approx(want_storage, rel=1e-9)
    assert egress[0].cost.total_usd == pytest.approx(want_egress, rel=1e-9)
    assert egress_rate == pytest.approx(0.09)  # aws to another cloud (the sourced table)
    # Another job's filter selects none of them.
    assert state_lines_for(store, LineFilter(job_id=job + 1), T0 + timedelta(days=20)) == []
