"""A gang's placement is deleted by the reconcile pass once the gang is over: not while any
node's instance still runs, asked again while the cloud says it is in use, recorded once
deleted (and never asked about again); a gang torn down before any node launched has its
placement deleted too. The adapters' own deletes are tested against moto and the GCP fake
(test_aws_moto.py, test_gcp_launch.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.gang import gang_key
from optimizer.jobs.reconcile import JobReconciler
from optimizer.store import Store
from providers.base import InstanceRef, InstanceState, InstanceStatus, ThrottledError
from tests.helpers import make_offer
from tests.helpers.jobs import Drafter

NOW = datetime(2026, 5, 4, 12, tzinfo=UTC)
OFFER = make_offer(observed_at=NOW)


class Cloud:
    """AWS as the reconciler sees it: instances in `running` run, others are terminated;
    `answers` are release_placement's replies in turn (an exception is raised)."""

    name = "aws"

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.answers: list[bool | Exception] = []
        self.released: list[tuple[str, str]] = []

    def describe(self, refs: Iterable[InstanceRef]) -> list[InstanceStatus]:
        return [
            InstanceStatus(
                r,
                InstanceState.RUNNING
                if r.instance_id in self.running
                else InstanceState.TERMINATED,
            )
            for r in refs
        ]

    def terminate(self, ref: InstanceRef) -> None:
        self.running.discard(ref.instance_id)

    def release_placement(self, region: str, placement: str) -> bool:
        self.released.append((region, placement))
        answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    yield store
    store.close()


def gang(store: Store, name: str, *, launched: bool) -> int:
    """A job whose one gang of two ended (its instances `i-<key>` when `launched`)."""
    job_id = store.jobs.add_job(name, "p", {"run": "x", "checkpoint_dir": "/c", "nodes": 2})
    for rank in (0, 1):
        key = gang_key(job_id, 1, rank)
        store.jobs.create_attempt(
            job_id, 1 + rank, key, OFFER, "sha", NOW, gang=1, node_rank=rank, nodes=2
        )
        ended: dict[str, Any] = {"ended_at": NOW, "state": "ended", "end_reason": "preempted"}
        if launched:
            ended.update(instance_id=f"i-{key}", stop_sent_at=NOW, terminated_by="gpuopt")
        store.jobs.update_attempt(key, **ended)
    return job_id


def run_pass(store: Store, cloud: Cloud, at: datetime) -> None:
    ctx = ReconcileContext(
        now=at,
        jobs=(),  # every job here is over
        policies={"p": SimpleNamespace(policy=None)},
        store=store,
        providers={"aws": ProviderHandle.given("aws", ProviderConfig(), cloud)},  # type: ignore[arg-type]
        emitter=Drafter(),
        clock=lambda: at,
    )
    JobReconciler(lambda: "http://d")(ctx)


def test_a_gangs_placement_is_deleted_once_every_node_is_gone_and_asked_again_while_in_use(
    store: Store,
) -> None:
    pair = gang(store, "pair", launched=True)
    cloud = Cloud()
    cloud.running = {f"i-{gang_key(pair, 1, 1)}"}  # node 1's instance still runs
    placement = ("us-east-1", f"gpuopt-{pair}-1")

    run_pass(store, cloud, NOW + timedelta(minutes=1))
    assert cloud.released == []  # not while a node's instance runs

    cloud.running.clear()
    cloud.answers = [False, ThrottledError("slow down", provider="aws")]
    run_pass(store, cloud, NOW + timedelta(minutes=2))  # in use, still (the cloud says)
    run_pass(store, cloud, NOW + timedelta(minutes=3))  # throttled
    assert cloud.released == [placement] * 2
    assert {a.placement_released_at for a in store.jobs.attempts(pair)} == {None}

    run_pass(store, cloud, NOW + timedelta(minutes=4))  # deleted
    assert cloud.released == [placement] * 3
    assert {a.placement_released_at for a in store.jobs.attempts(pair)} == {
        NOW + timedelta(minutes=4)
    }
    run_pass(store, cloud, NOW + timedelta(minutes=5))
    assert cloud.released == [placement] * 3  # never asked about again
    assert store.jobs.unreleased_gangs(["aws"]) == []


def test_a_gang_torn_down_before_any_node_launched_has_its_placement_deleted(
    store: Store,
) -> None:
    # The first node made the placement, then its launch failed: no instance ever ran in it.
    torn = gang(store, "torn", launched=False)
    cloud = Cloud()
    run_pass(store, cloud, NOW + timedelta(minutes=1))
    assert cloud.released == [("us-east-1", f"gpuopt-{torn}-1")]
    assert store.jobs.unreleased_gangs(["aws"]) == []
