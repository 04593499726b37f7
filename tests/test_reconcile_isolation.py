"""One job or policy the reconciler cannot handle never stops the others: stored data from
before the bounds (a job whose spec says `max_duration: 1e300`, a policy whose `min_stable`
overflows a timedelta) used to raise inside the pass, so no job launched, relaunched, was
cancelled or cleaned up, on every pass and across restarts. Now the job is failed with why (or
cancelled, when asked: cancel and remove always work), a policy is left out of the step it
breaks with a `policy.skipped` event, and every other job goes on.

The reconciler runs against a fake cloud, one pass at a time, on a fixed clock; the bad data
is written straight into the store, past every validation, as an older daemon would have."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from optimizer.clock import ManualClock
from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.reconcile import JobReconciler
from optimizer.jobs.windows import WindowWatch
from optimizer.model import EventKind
from optimizer.store import JobRecord, Store
from optimizer.store.tables import Job
from policies.loader import parse_policy
from policies.schema import Policy
from tests.helpers import (
    api,
    make_config,
    make_offer,
    policy_text,
    running,
    wait_until,
    write_policy,
)
from tests.helpers.cancel import NOW, FakeCloud, InForce
from tests.helpers.jobs import Drafter

TEXT = (
    "apiVersion: gpuopt/v1\nkind: Policy\nname: {name}\nworkload: {{gpus: 1, gpu_memory_gib: 16}}\n"
)
POLICY = parse_policy(TEXT.format(name="p"))
MOVING = parse_policy(TEXT.format(name="m") + "migration: {enabled: true}\n")
SPEC: dict[str, Any] = {"run": "x", "checkpoint_dir": "/c"}
POISON = {**SPEC, "max_duration": 1e300}  # what validation let through before the bounds


class World:
    """Jobs under loaded policies, a fake cloud with two pools, and a reconciler."""

    def __init__(self, store: Store, policies: dict[str, Policy] | None = None) -> None:
        self.store = store
        self.clock = ManualClock(NOW)
        self.cloud = FakeCloud()
        store.prices.record_offers(
            [make_offer(observed_at=NOW), make_offer(zone="use1-az2", observed_at=NOW)]
        )
        self.policies = policies or {"p": POLICY}
        self.reconciler = JobReconciler(lambda: "http://127.0.0.1:1")
        self.handle = ProviderHandle.given("aws", ProviderConfig(), self.cloud)

    def run(self) -> None:
        self.reconciler(
            ReconcileContext(
                now=self.clock(),
                jobs=tuple(self.store.jobs.live_jobs()),
                policies={name: InForce(p) for name, p in self.policies.items()},
                store=self.store,
                providers={"aws": self.handle},
                emitter=Drafter(),
                clock=self.clock,
            )
        )

    def job(self, job_id: int) -> JobRecord:
        job = self.store.jobs.get_job_by_id(job_id)
        assert job is not None
        return job

    def report(self, job_id: int, **values: Any) -> None:
        """What the job's current attempt's agent reported."""
        (key,) = [a.key for a in self.store.jobs.attempts(job_id) if not a.ended]
        self.store.jobs.update_attempt(key, **values)

    def to_running(self, job_id: int) -> None:
        self.run()
        self.report(job_id, registered_at=self.clock())
        self.run()
        self.report(job_id, probe_status="pass", job_started_at=self.clock())
        self.run()
        assert self.job(job_id).state == "running"

    def poison(self, job_id: int) -> None:
        """Rewrite a stored spec as an older daemon accepted it, past every validation."""
        with self.store.engine.begin() as conn:
            conn.execute(
                update(Job.__table__)  # type: ignore[arg-type]
                .where(Job.__table__.c.id == job_id)  # type: ignore[attr-defined]
                .values(spec=json.dumps(POISON))
            )

    def events(self, job_id: int, kind: EventKind) -> list[str]:
        return [e.message for e in self.store.events.recent(job_id=job_id) if e.kind == kind]


def test_a_stored_spec_that_overflows_fails_its_job_and_the_other_job_launches(
    store: Store,
) -> None:
    w = World(store)
    bad = store.jobs.add_job("bad", "p", POISON)  # first in the pass
    good = store.jobs.add_job("good", "p", SPEC)
    w.run()
    assert w.job(good).state == "provisioning"
    assert w.cloud.launched == [f"i-{good}-1"]
    failed = w.job(bad)
    assert failed.state == "failed"
    assert "could not be reconciled" in failed.reason and "OverflowError" in failed.reason
    [said] = w.events(bad, EventKind.JOB_FAILED)
    assert "could not be reconciled" in said and "OverflowError" in said
    # The next passes carry the healthy job on; the failed one stays failed, said once.
    w.report(good, registered_at=w.clock())
    w.run()
    assert w.job(good).state == "probing"
    assert w.job(bad).state == "failed" and len(w.events(bad, EventKind.JOB_FAILED)) == 1
    # An ended job is removed as any other.
    assert store.jobs.remove_job("bad") is not None


def test_a_running_poisoned_job_is_failed_and_its_instance_terminated(store: Store) -> None:
    w = World(store)
    bad = store.jobs.add_job("bad", "p", SPEC)
    w.to_running(bad)
    w.poison(bad)
    good = store.jobs.add_job("good", "p", SPEC)
    w.run()
    assert w.job(bad).state == "failed"
    assert w.cloud.running == {f"i-{good}-1"}  # the bad job's instance is gone
    assert all(a.ended for a in store.jobs.attempts(bad))
    assert w.job(good).state == "provisioning"


def test_a_poisoned_job_can_be_cancelled_and_removed(store: Store) -> None:
    w = World(store)
    bad = store.jobs.add_job("bad", "p", SPEC)
    w.to_running(bad)
    w.poison(bad)
    job, recorded = store.jobs.request_cancel("bad", at=w.clock())
    assert recorded and job is not None
    w.run()
    cancelled = w.job(bad)
    assert (cancelled.state, cancelled.reason) == ("cancelled", "cancelled by request")
    [said] = w.events(bad, EventKind.JOB_CANCELLED)
    assert "could not be reconciled" in said
    assert w.cloud.running == set() and w.cloud.terminated == [f"i-{bad}-1"]
    removed = store.jobs.remove_job("bad")
    assert removed is not None and removed.removed_at is not None


def test_a_poisoned_running_job_does_not_stop_the_migration_pass_or_the_others(
    store: Store,
) -> None:
    """The migration pass reads every running job of a policy that moves jobs before any
    job is handled: a bad one there used to stop the whole pass."""
    w = World(store, {"m": MOVING})
    bad = store.jobs.add_job("bad", "m", SPEC)
    w.to_running(bad)
    w.poison(bad)
    good = store.jobs.add_job("good", "m", SPEC)
    w.run()
    assert w.job(good).state == "provisioning"
    assert w.job(bad).state == "failed"


def test_a_policy_that_overflows_is_skipped_with_an_event_and_the_others_go_on(
    store: Store,
) -> None:
    """A policy loaded before the bounds, `min_stable: 99999999999h`: its moves are skipped
    and said once; its jobs and every other policy's are still reconciled."""
    broken = MOVING.migration.model_copy(update={"min_stable": 99999999999 * 3600.0})
    bad_policy = MOVING.model_copy(update={"name": "bad", "migration": broken})
    w = World(store, {"bad": bad_policy, "p": POLICY})
    under_bad = store.jobs.add_job("under-bad", "bad", SPEC)
    good = store.jobs.add_job("good", "p", SPEC)
    for _ in range(2):
        w.run()
    assert w.job(good).state == "provisioning"
    assert w.job(under_bad).state == "provisioning"  # moving is all the bad value touches
    skipped = [e for e in store.events.recent() if e.kind == EventKind.POLICY_SKIPPED]
    assert len(skipped) == 1, [e.message for e in skipped]
    assert skipped[0].policy == "bad" and skipped[0].data is not None
    assert "OverflowError" in skipped[0].data["reason"]


def test_a_policy_whose_ranking_overflows_does_not_keep_another_policys_window_event(
    store: Store,
) -> None:
    """The schedule-window watch judges each policy at its boundary: one that raises there
    (`max_price_age_hours: 1e300`, loaded before the bounds) leaves the others' events be."""
    opens = datetime(2026, 1, 16, 8, 0, tzinfo=UTC)  # office hours open, 09:00 CET
    schedule = (
        "schedule: {timezone: Europe/Berlin, windows: [{name: office-hours, "
        'days: [mon, tue, wed, thu, fri], hours: "09:00-18:00", markets: [on_demand]}]}\n'
    )
    good = parse_policy(TEXT.format(name="good") + schedule)
    bad = parse_policy(TEXT.format(name="bad") + schedule).model_copy(
        update={"max_price_age_hours": 1e300}
    )
    offer = make_offer(observed_at=opens)
    store.prices.record_offers([offer])
    for name in ("bad", "good"):  # "bad" is judged first
        job = store.jobs.add_job(name, name, SPEC, at=opens)
        store.jobs.transition_job(job, expected="pending", state="running", reason="", at=opens)
        store.jobs.create_attempt(job, 1, f"{name}-1", offer, "sha", opens)
    watch = WindowWatch()
    for now in (opens - timedelta(minutes=5), opens + timedelta(seconds=30)):
        watch(
            ReconcileContext(
                now=now,
                jobs=tuple(store.jobs.live_jobs()),
                policies={"bad": InForce(bad), "good": InForce(good)},
                store=store,
                providers={},
                emitter=Drafter(),
                clock=ManualClock(now),
            )
        )
    changed = store.events.of_kind(EventKind.POLICY_WINDOW_CHANGED, opens - timedelta(hours=1))
    assert [e.policy for e in changed] == ["good"]


@pytest.mark.usefixtures("daemon_env")
def test_a_daemon_started_over_a_poisoned_job_cancels_and_removes_through_the_api(
    tmp_path: Path,
) -> None:
    """A job stored with `max_duration: 1e300` before the bounds: the daemon that starts over
    that database still decides every other job's cancel, and the bad job can be removed."""
    write_policy(tmp_path / "policies", "small.yaml", policy_text("small", memory=16))
    config = make_config(tmp_path)
    earlier = Store(config.effective_database_url)
    earlier.create_all()
    earlier.jobs.add_job("bad", "small", POISON)  # what an older daemon stored
    earlier.jobs.add_job("endless", "small", {**SPEC, "max_duration": float("inf")})
    earlier.close()
    job = {"name": "good", "policy": "small", "run": "x", "checkpoint_dir": "/c"}
    with running(config) as daemon, api(daemon) as client:
        assert client.post("/jobs", json=job).status_code == 201
        asked = client.post("/jobs/good/cancel")
        assert asked.status_code == 200, asked.text
        want = {"bad": "failed", "endless": "failed", "good": "cancelled"}
        wait_until(
            lambda: {j["name"]: j["state"] for j in client.get("/jobs").json()["jobs"]} == want,
            what="the good job cancelled and the bad ones ended",
        )
        bad = client.get("/jobs/bad").json()
        assert "could not be reconciled" in bad["reason"], bad["reason"]
        assert client.get("/jobs/endless").status_code == 200  # an infinity stored in a spec
        for name in ("bad", "endless"):
            removed = client.delete(f"/jobs/{name}")
            assert removed.status_code == 200, removed.text
            assert client.get(f"/jobs/{name}").status_code == 404
