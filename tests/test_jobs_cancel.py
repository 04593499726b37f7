"""A cancel is a request that the reconciler decides: whatever state the job is in, and even
when a reconcile pass that read the job before the cancel writes after it, the job ends
`cancelled`, its instances are terminated, and no state follows `cancelled` in its events.

The reconciler runs here against a fake cloud, one pass at a time, on a fixed clock. A "pass
in flight" is a context holding the jobs as read before the cancel: the pass then decides
and writes from what it read, as a pass that was already running would."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.clock import ManualClock
from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.reconcile import STOP_GRACE, JobReconciler
from optimizer.model import EventKind
from optimizer.store import JobRecord, Store
from policies.loader import parse_policy
from tests.helpers import make_offer
from tests.helpers.cancel import NOW, FakeCloud, InForce
from tests.helpers.jobs import Drafter

POLICY = parse_policy(
    "apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {gpus: 1, gpu_memory_gib: 16}\n"
)


class World:
    """One job under one policy, a fake cloud with one offer, and a reconciler."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.clock = ManualClock(NOW)
        self.cloud = FakeCloud()
        # Two pools: a replacement avoids the pool its predecessor was interrupted in.
        store.prices.record_offers(
            [make_offer(observed_at=NOW), make_offer(zone="use1-az2", observed_at=NOW)]
        )
        self.job_id = store.jobs.add_job("train", "p", {"run": "x", "checkpoint_dir": "/c"})
        self.reconciler = JobReconciler(lambda: "http://127.0.0.1:1")
        self.handle = ProviderHandle.given("aws", ProviderConfig(), self.cloud)

    def read(self) -> ReconcileContext:
        """What a pass reads when it starts."""
        return ReconcileContext(
            now=self.clock(),
            jobs=tuple(self.store.jobs.live_jobs()),
            policies={"p": InForce(POLICY)},
            store=self.store,
            providers={"aws": self.handle},
            emitter=Drafter(),
            clock=self.clock,
        )

    def run(self, ctx: ReconcileContext | None = None) -> JobRecord:
        """Finish a pass (one that read earlier, or a new one) and return the job after it."""
        self.reconciler(ctx or self.read())
        job = self.store.jobs.get_job_by_id(self.job_id)
        assert job is not None
        return job

    def current(self) -> str:
        (attempt,) = [a for a in self.store.jobs.attempts(self.job_id) if not a.ended]
        return attempt.key

    def report(self, **values: Any) -> None:
        """What the current attempt's agent reported."""
        self.store.jobs.update_attempt(self.current(), **values)

    def states(self) -> list[str]:
        """The job's states in the order its events recorded them."""
        events = self.store.events.recent(job_id=self.job_id, limit=1000)  # oldest first
        return [
            e.data["to"]
            for e in events
            if e.kind == EventKind.JOB_STATE_CHANGED and e.data is not None
        ]


def to_pending(w: World) -> None:
    """No pass yet: the job is as submitted. The pass in flight launches it."""


def to_provisioning(w: World) -> None:
    assert w.run().state == "provisioning"


def to_probing(w: World) -> None:
    to_provisioning(w)
    w.report(registered_at=w.clock())
    assert w.run().state == "probing"


def to_running(w: World) -> None:
    to_probing(w)
    w.report(probe_status="pass", job_started_at=w.clock())
    assert w.run().state == "running"


def to_recovering(w: World) -> None:
    """Running, then an interruption notice: the job is stopped and a replacement launched."""
    to_running(w)
    w.report(notice_at=w.clock())
    job = w.run()
    assert (job.state, job.restarts, len(w.cloud.launched)) == ("provisioning", 1, 2)


def to_interrupted(w: World) -> None:
    """A job stored `interrupted` (a state the machine names) with its attempt running."""
    to_running(w)
    job = w.store.jobs.get_job_by_id(w.job_id)
    assert job is not None
    moved = w.store.jobs.transition_job(
        w.job_id, expected=job.state, state="interrupted", reason="test", at=w.clock()
    )
    assert moved is not None


# What the pass in flight sees that moves the job on (its write would change the state).
def nothing(w: World) -> None:
    pass


def registers(w: World) -> None:
    w.report(registered_at=w.clock())


def starts(w: World) -> None:
    w.report(probe_status="pass", job_started_at=w.clock())


def gets_a_notice(w: World) -> None:
    w.report(notice_at=w.clock())


# stage: (how to get there, what the pass in flight sees, the state the pass writes)
STAGES = {
    "pending": (to_pending, nothing, "provisioning"),
    "provisioning": (to_provisioning, registers, "probing"),
    "probing": (to_probing, starts, "running"),
    "running": (to_running, gets_a_notice, "provisioning"),
    "recovering": (to_recovering, registers, "probing"),
    "interrupted": (to_interrupted, nothing, "running"),
}


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("race", [False, True], ids=["between-passes", "pass-in-flight"])
def test_a_cancel_in_any_state_ends_the_job_cancelled_with_its_instances_terminated(
    store: Store, stage: str, race: bool
) -> None:
    w = World(store)
    setup, observe, in_flight_writes = STAGES[stage]
    setup(w)
    before = w.store.jobs.get_job_by_id(w.job_id)
    assert before is not None
    assert before.state == ("provisioning" if stage == "recovering" else stage)

    if race:
        observe(w)
        ctx = w.read()  # the pass reads the job …
        job, recorded = w.store.jobs.request_cancel("train", at=w.clock())  # … the cancel …
        assert recorded and job is not None and job.state == before.state  # a request only
        assert w.run(ctx).state == in_flight_writes  # … and the pass writes what it decided
    else:
        w.store.jobs.request_cancel("train", at=w.clock())

    w.clock.advance(1)
    job = w.run()
    assert (job.state, job.reason) == ("cancelled", "cancelled by request")
    # A stopped attempt (the interruption) keeps its grace to checkpoint; then it goes too.
    w.clock.advance(STOP_GRACE.total_seconds())
    for _ in range(2):
        assert w.run().state == "cancelled"  # later passes leave it be
    # A job cancelled while pending between passes never gets an instance; every other did.
    assert bool(w.cloud.launched) == (stage != "pending" or race), w.cloud.launched
    assert w.cloud.running == set(), f"instances left running: {w.cloud.running}"
    states = w.states()
    assert states[-1] == "cancelled" and states.count("cancelled") == 1, states
    cancels = [
        e for e in w.store.events.recent(job_id=w.job_id) if e.kind == EventKind.JOB_CANCELLED
    ]
    assert len(cancels) == 1 and cancels[0].data is not None
    assert cancels[0].data["state_before"] == (in_flight_writes if race else before.state)
    assert all(a.ended for a in w.store.jobs.attempts(w.job_id))
    # Asked again once it has ended: nothing is recorded.
    assert w.store.jobs.request_cancel("train")[1] is False


def test_a_pass_that_read_a_state_since_changed_writes_nothing(store: Store) -> None:
    """Compare-and-set: a pass deciding from a stale read loses the race and leaves the job
    as the winner wrote it; the next pass decides again."""
    w = World(store)
    stale = w.read()  # pending: this pass will launch
    w.store.jobs.request_cancel("train", at=w.clock())
    assert w.run().state == "cancelled"  # a pass that started later decided the cancel first
    assert w.cloud.launched == []
    job = w.run(stale)  # the stale pass launches, and its write to `provisioning` is refused
    assert job.state == "cancelled"
    assert w.states() == ["cancelled"]
    w.run()  # the next pass ends the stale pass's attempt and terminates its instance
    assert w.cloud.running == set()
    assert all(a.ended for a in w.store.jobs.attempts(w.job_id))
