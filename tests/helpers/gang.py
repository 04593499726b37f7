"""A gang launch through the daemon's launch walk against any provider (moto's AWS, the
GCP fake): shared by the adapters' gang tests."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.reconcile import JobReconciler
from optimizer.jobs.recovery import Failover
from optimizer.model import Offer
from optimizer.store import Store
from policies.loader import parse_policy
from tests.helpers.aws import NOW
from tests.helpers.jobs import Drafter

POLICY = parse_policy("apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {nodes: 2}\n")


def gang_walk(tmp_path: Path, source: Any, offers: list[Offer]) -> list[str]:
    """Walk `offers` in order for a two-node job on `source`; the instance ids of every node
    the walk launched, in launch order (a torn-down gang's included)."""
    store = Store(f"sqlite:///{tmp_path / 'gang.sqlite'}")
    store.create_all()
    try:
        store.jobs.add_job("pair", "p", {"run": "x", "checkpoint_dir": "/c", "nodes": 2})
        job = store.jobs.get_job("pair")
        assert job is not None
        handle = ProviderHandle.given(source.name, ProviderConfig(), source)
        ctx = ReconcileContext(
            now=NOW,
            jobs=(job,),
            policies={"p": SimpleNamespace(policy=POLICY)},
            store=store,
            providers={source.name: handle},
            emitter=Drafter(),
            clock=lambda: NOW,
            leading=lambda: True,
        )
        launcher = JobReconciler(lambda: "http://daemon").launcher
        walked = launcher._try(ctx, job, offers, Failover(), 2)
        assert walked.launched, walked.why
        return [a.instance_id for a in store.jobs.attempts(job.id) if a.instance_id]
    finally:
        store.close()


def walk_one(tmp_path: Path, source: Any, offer: Offer, policy_text: str) -> str:
    """Walk one offer for a single-node job under `policy_text` (named `p`) on `source`; the
    instance id it launched."""
    store = Store(f"sqlite:///{tmp_path / 'one.sqlite'}")
    store.create_all()
    try:
        store.jobs.add_job("one", "p", {"run": "x", "checkpoint_dir": "/c"})
        job = store.jobs.get_job("one")
        assert job is not None
        handle = ProviderHandle.given(source.name, ProviderConfig(), source)
        ctx = ReconcileContext(
            now=NOW,
            jobs=(job,),
            policies={"p": SimpleNamespace(policy=parse_policy(policy_text))},
            store=store,
            providers={source.name: handle},
            emitter=Drafter(),
            clock=lambda: NOW,
            leading=lambda: True,
        )
        walked = JobReconciler(lambda: "http://daemon").launcher._try(
            ctx, job, [offer], Failover(), 1
        )
        assert walked.launched, walked.why
        [attempt] = store.jobs.attempts(job.id)
        assert attempt.instance_id is not None
        return attempt.instance_id
    finally:
        store.close()
