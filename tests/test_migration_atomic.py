"""A move is one transaction: the old attempt ends as `migrated` exactly when the
`job.migrated` event (and its alert) is recorded. A daemon killed anywhere in a move leaves
either both or neither, and a move that did not commit is undone by the next pass: the job
runs on where it was, and the attempt launched for the move is ended and its instance
terminated.

The reconciler runs here against a fake cloud, one pass at a time, on a fixed clock; a
"SIGKILL" is a BaseException raised at the step named, which ends the pass there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from optimizer.clock import ManualClock
from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.migration import Move, Plan, Reason
from optimizer.jobs.moving import Moves
from optimizer.jobs.reconcile import ABANDONED, JobReconciler
from optimizer.jobs.views import PassView
from optimizer.model import EventKind, Offer
from optimizer.store import Store
from optimizer.store.jobs import AttemptRecord
from policies.loader import parse_policy
from providers.base import CapacityError, InstanceRef, LaunchSpec
from tests.helpers import make_offer
from tests.helpers.cancel import NOW, FakeCloud, InForce
from tests.helpers.jobs import Drafter

POLICY = parse_policy(
    "apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {gpus: 1, gpu_memory_gib: 16}\n"
)
HERE = ("aws", "us-east-1", "use1-az1", "g5.xlarge", "spot")
THERE = ("aws", "us-east-1", "use1-az2", "g5.xlarge", "spot")


class Killed(BaseException):
    """The daemon's process ended here (no `except Exception` of the pass catches it)."""


class Planned(Moves):
    """A migration pass that plans the move its reconciler holds, if any."""

    def __init__(self, owner: Moving) -> None:
        super().__init__(owner.acting)
        self.owner = owner

    def plan(self, ctx: ReconcileContext, view: PassView) -> Plan:
        move = self.owner.move
        return Plan(moves=(move,)) if move is not None else Plan()


class Moving(JobReconciler):
    """A reconciler whose migration pass moves the job to THERE while `move` is set."""

    move: Move | None = None

    def __init__(self, daemon_url: Callable[[], str]) -> None:
        super().__init__(daemon_url)
        self.moves = Planned(self)


class FlakyCloud(FakeCloud):
    """A FakeCloud whose next launch dies (`killed`) or finds no capacity (`full`)."""

    killed = False
    full = False

    def launch(self, offer: Offer, spec: LaunchSpec, key: str) -> InstanceRef:
        if self.killed:
            self.killed = False
            raise Killed("SIGKILL during the launch call")
        if self.full:
            raise CapacityError("no capacity")
        return super().launch(offer, spec, key)


class World:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.clock = ManualClock(NOW)
        self.cloud = FlakyCloud()
        store.prices.record_offers(
            [make_offer(observed_at=NOW), make_offer(zone="use1-az2", observed_at=NOW)]
        )
        self.job_id = store.jobs.add_job("train", "p", {"run": "x", "checkpoint_dir": "/c"})
        self.handle = ProviderHandle.given("aws", ProviderConfig(), self.cloud)
        self.reconciler = self.restart()

    def restart(self) -> Moving:
        """A fresh reconciler: the daemon after a restart (nothing held in memory)."""
        self.reconciler = Moving(lambda: "http://127.0.0.1:1")
        return self.reconciler

    def run(self) -> None:
        self.reconciler(
            ReconcileContext(
                now=self.clock(),
                jobs=tuple(self.store.jobs.live_jobs()),
                policies={"p": InForce(POLICY)},
                store=self.store,
                providers={"aws": self.handle},
                emitter=Drafter(),
                clock=self.clock,
            )
        )

    def state(self) -> str:
        job = self.store.jobs.get_job_by_id(self.job_id)
        assert job is not None
        return job.state

    def attempts(self) -> list[AttemptRecord]:
        return self.store.jobs.attempts(self.job_id)

    def migrated_events(self) -> list[Any]:
        return self.store.events.list_events(kind=EventKind.JOB_MIGRATED, job_id=self.job_id)

    def to_running(self) -> AttemptRecord:
        self.run()
        [first] = self.attempts()
        assert first.pool == HERE
        self.store.jobs.update_attempt(
            first.key, registered_at=NOW, probe_status="pass", job_started_at=NOW
        )
        self.run()
        assert self.state() == "running"
        return first

    def plan_move(self) -> None:
        self.reconciler.move = Move(
            job_id=self.job_id,
            job="train",
            policy="p",
            reason=Reason.CHEAPER,
            targets=(THERE,),
            from_usd=1.0,
            to_usd=0.5,
            expected_saving_usd=2.0,
            overhead_usd=0.1,
            message="cheaper there",
        )


@pytest.fixture
def world(store: Store) -> World:
    return World(store)


def both_or_neither(w: World, first: AttemptRecord) -> bool:
    """Whether the old attempt ended `migrated` exactly when a `job.migrated` event names it."""
    old = w.store.jobs.attempt(first.key)
    assert old is not None
    ended = old.end_reason == "migrated"
    named = [e for e in w.migrated_events() if (e.data or {}).get("attempt") == first.number]
    return ended == bool(named)


def test_a_move_ends_the_old_attempt_with_its_event(world: World) -> None:
    first = world.to_running()
    world.plan_move()
    world.run()
    old, new = world.attempts()
    assert (old.key, old.end_reason, old.ended_at) == (first.key, "migrated", NOW)
    assert new.pool == THERE and not new.ended
    [event] = world.migrated_events()
    assert event.data is not None and event.data["attempt"] == first.number
    assert event.data["to_pool"] == "/".join(THERE)
    assert world.state() == "provisioning"


def test_a_move_that_finds_no_capacity_leaves_no_trace(world: World) -> None:
    first = world.to_running()
    world.plan_move()
    world.cloud.full = True
    world.run()
    old = world.store.jobs.attempt(first.key)
    assert old is not None and not old.ended and old.end_reason is None
    assert world.migrated_events() == [] and world.state() == "running"


@pytest.mark.parametrize("where", ["launch", "transaction"])
def test_a_sigkill_mid_move_leaves_the_end_and_the_event_both_or_neither(
    world: World, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = world.to_running()
    world.plan_move()
    if where == "launch":
        world.cloud.killed = True
    else:  # after the launch, as the move's transaction is about to commit
        original = world.store.jobs.transition_job

        def dies(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("state") == "provisioning":
                raise Killed("SIGKILL before the move committed")
            return original(*args, **kwargs)

        monkeypatch.setattr(world.store.jobs, "transition_job", dies)
    with pytest.raises(Killed):
        world.run()
    monkeypatch.undo()
    assert both_or_neither(world, first)

    # The daemon restarts, its planner no longer wants the move: the move never happened.
    world.restart()
    world.run()
    world.run()
    assert both_or_neither(world, first)
    old, new = world.attempts()
    assert old.key == first.key and not old.ended  # the job runs on where it was
    assert new.ended and new.end_reason == ABANDONED
    assert world.cloud.running == {f"i-{first.key}"}  # the move's instance is terminated
    assert world.migrated_events() == [] and world.state() == "running"
