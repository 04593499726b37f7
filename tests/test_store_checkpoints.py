"""The checkpoints repository on SQLite and PostgreSQL: rows once per attempt and name (a
report sent again adds nothing, nor its event), newest first, pruning marks rows deleted,
restores listed, and which attempts committed their final checkpoint."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from optimizer.model import EventKind
from optimizer.store import NewEvent, Store
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.offers import T0


def job_with_attempts(store: Store, n: int = 2) -> tuple[int, list[int]]:
    job = store.jobs.add_job("train", "p", {"run": "x", "checkpoint": "s3://bkt/r"}, at=T0)
    ids = []
    for number in range(1, n + 1):
        key = f"{job}-{number}"
        ids.append(
            store.jobs.create_attempt(
                job, number, key, make_offer(provider="aws"), token_sha256(key), T0
            ).id
        )
    return job, ids


def commit(store: Store, job: int, attempt: int, name: str, at_s: int, **over: Any) -> bool:
    values: dict[str, Any] = {
        "job_id": job,
        "attempt_id": attempt,
        "name": name,
        "step": int(name.rsplit("-", 1)[-1]),
        "size_bytes": 5 * 2**33,
        "files": 3,
        "uri": f"s3://bkt/r/data/{name}",
        "provider": "aws",
        "region": "us-east-1",
        "committed_at": T0 + timedelta(seconds=at_s),
        "upload_s": 4.0,
        "final": False,
        **over,
    }
    return store.checkpoints.add_checkpoint(**values)


def test_a_checkpoint_is_kept_once_with_its_event_and_listed_newest_first(store: Store) -> None:
    job, (first, _) = job_with_attempts(store)
    event = NewEvent(EventKind.CHECKPOINT_COMMITTED, "committed", data={"name": "step-5"})
    assert commit(store, job, first, "step-5", 10, event=event)
    assert not commit(store, job, first, "step-5", 10, event=event)  # sent again
    assert commit(store, job, first, "step-10", 20)
    found = store.checkpoints.checkpoints(job)
    assert [(c.name, c.step, c.size_bytes) for c in found] == [
        ("step-10", 10, 5 * 2**33),
        ("step-5", 5, 5 * 2**33),
    ]
    [recorded] = store.events.list_events(kind=EventKind.CHECKPOINT_COMMITTED)
    assert recorded.job_id == job and recorded.data == {"name": "step-5"}


def test_pruning_marks_the_named_rows_deleted_once(store: Store) -> None:
    job, (first, second) = job_with_attempts(store)
    for name, at in (("step-5", 10), ("step-10", 20)):
        commit(store, job, first, name, at)
    commit(store, job, second, "step-5", 30)  # the same name, again, by the next attempt
    pruned = T0 + timedelta(minutes=5)
    assert store.checkpoints.mark_deleted(job, ["step-5", "step-99"], pruned) == 2
    assert store.checkpoints.mark_deleted(job, ["step-5"], pruned + timedelta(1)) == 0
    deleted = {(c.attempt_id, c.name): c.deleted_at for c in store.checkpoints.checkpoints(job)}
    assert deleted == {
        (first, "step-5"): pruned,
        (first, "step-10"): None,
        (second, "step-5"): pruned,
    }


def test_restores_are_kept_once_and_listed_oldest_first(store: Store) -> None:
    job, (_, earlier, later) = job_with_attempts(store, 3)
    values: dict[str, Any] = {
        "job_id": job,
        "checkpoint_name": "step-5",
        "size_bytes": 2**34,
        "fetched_bytes": 2**33,
        "seconds": 9.5,
        "from_provider": "aws",
        "from_region": "us-east-1",
        "to_provider": "gcp",
        "to_region": "europe-west4",
    }
    assert store.checkpoints.add_restore(attempt_id=later, at=T0 + timedelta(hours=1), **values)
    assert store.checkpoints.add_restore(attempt_id=earlier, at=T0, **values)
    assert not store.checkpoints.add_restore(attempt_id=earlier, at=T0, **values)
    found = store.checkpoints.restores(job)
    assert [(r.attempt_id, r.fetched_bytes, r.to_region) for r in found] == [
        (earlier, 2**33, "europe-west4"),
        (later, 2**33, "europe-west4"),
    ]


def test_final_committed_names_the_attempts_whose_last_checkpoint_is_up(store: Store) -> None:
    job, (first, second) = job_with_attempts(store)
    commit(store, job, first, "step-5", 10)
    assert store.checkpoints.final_committed([first, second]) == set()
    commit(store, job, first, "step-7", 20, final=True)
    assert store.checkpoints.final_committed([first, second]) == {first}
    assert store.checkpoints.final_committed([]) == set()


def test_the_same_name_committed_again_at_the_stop_becomes_final(store: Store) -> None:
    """A periodic checkpoint saved just before the stop and again by the job's SIGTERM handler
    (the same step, the same name) is the attempt's final one: the row says so once."""
    job, (first, _) = job_with_attempts(store)
    assert commit(store, job, first, "step-55", 10)
    event = NewEvent(EventKind.CHECKPOINT_COMMITTED, "final", data={"name": "step-55"})
    assert commit(store, job, first, "step-55", 20, final=True, event=event, upload_s=1.5)
    assert not commit(store, job, first, "step-55", 30, final=True)  # sent again: kept once
    [row] = store.checkpoints.checkpoints(job)
    assert row.final and row.upload_s == 1.5
    assert row.committed_at == T0 + timedelta(seconds=20)
    assert store.checkpoints.final_committed([first]) == {first}
    assert len(store.events.list_events(kind=EventKind.CHECKPOINT_COMMITTED)) == 1
