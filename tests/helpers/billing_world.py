"""A fake cloud and the world around a reconcile pass (the billing and window tests)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from optimizer.clock import ManualClock
from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.reconcile import JobReconciler
from optimizer.model import EventKind, Offer
from optimizer.store import Store
from optimizer.store.jobs import AttemptRecord
from policies.loader import parse_policy
from providers.base import EndReason, InstanceRef, InstanceState, InstanceStatus, LaunchSpec
from tests.helpers import make_offer
from tests.helpers.jobs import Drafter

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


POLICY = parse_policy(
    "apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {gpus: 1, gpu_memory_gib: 16}\n"
)


BOOT = timedelta(seconds=7)  # the cloud's launch comes a little after gpuopt's call


@dataclass
class Instance:
    launched_at: datetime
    ended_at: datetime | None = None
    reason: EndReason | None = None


@dataclass
class Cloud:
    """Instances with the cloud's own times. `silent` instances end without the cloud saying
    when (an AWS reclaim); `reclaim` is the cloud ending one itself."""

    clock: ManualClock
    instances: dict[str, Instance] = field(default_factory=dict)
    terminated: list[str] = field(default_factory=list)
    silent: set[str] = field(default_factory=set)
    hide_launch: bool = False

    def fetch_offers(self, regions: Any = None) -> list[Offer]:
        return []

    def launch(self, offer: Offer, spec: LaunchSpec, key: str) -> InstanceRef:
        instance = f"i-{key}"
        self.instances.setdefault(instance, Instance(self.clock() + BOOT))
        return InstanceRef(offer.provider, offer.region, offer.zone, instance)

    def describe(self, refs: Sequence[InstanceRef]) -> list[InstanceStatus]:
        out = []
        for ref in refs:
            i = self.instances[ref.instance_id]
            launched = None if self.hide_launch else i.launched_at
            if i.ended_at is None:
                out.append(InstanceStatus(ref, InstanceState.RUNNING, launched_at=launched))
                continue
            ended = None if ref.instance_id in self.silent else i.ended_at
            out.append(
                InstanceStatus(
                    ref,
                    InstanceState.TERMINATED,
                    i.reason,
                    "",
                    launched_at=launched,
                    terminated_at=ended,
                )
            )
        return out

    def terminate(self, ref: InstanceRef) -> None:
        self.terminated.append(ref.instance_id)
        i = self.instances[ref.instance_id]
        if i.ended_at is None:
            i.ended_at, i.reason = self.clock(), EndReason.USER

    def reclaim(self, instance: str) -> None:
        i = self.instances[instance]
        i.ended_at, i.reason = self.clock(), EndReason.PREEMPTED


@dataclass(frozen=True)
class InForce:
    policy: Any


class World:
    """One job under one policy on one cloud (`provider`), a reconciler, a ManualClock."""

    def __init__(self, store: Store, provider: str = "aws") -> None:
        self.store = store
        self.clock = ManualClock(NOW)
        self.cloud = Cloud(self.clock)
        store.prices.record_offers(
            [
                make_offer(provider=provider, observed_at=NOW),
                make_offer(provider=provider, zone="use1-az2", observed_at=NOW),
            ]
        )
        self.provider = provider
        self.job_id = store.jobs.add_job("train", "p", {"run": "x", "checkpoint_dir": "/c"})
        self.reconciler = JobReconciler(lambda: "http://127.0.0.1:1")
        self.handle = ProviderHandle.given(provider, ProviderConfig(), self.cloud)
        self._ids = itertools.count()

    def run(self) -> None:
        ctx = ReconcileContext(
            now=self.clock(),
            jobs=tuple(self.store.jobs.live_jobs()),
            policies={"p": InForce(POLICY)},
            store=self.store,
            providers={self.provider: self.handle},
            emitter=Drafter(),
            clock=self.clock,
        )
        self.reconciler(ctx)

    def attempt(self, number: int) -> AttemptRecord:
        (found,) = [a for a in self.store.jobs.attempts(self.job_id) if a.number == number]
        return found

    def report(self, number: int, kind: str, **data: Any) -> None:
        """An event from attempt `number`'s agent, now."""
        event = {
            "id": f"e{next(self._ids)}",
            "kind": kind,
            "at": self.clock().isoformat(),
            "data": data,
        }
        self.store.jobs.record_agent_events(self.attempt(number).key, [event], self.clock())

    def running(self) -> None:
        """Launch the job and bring its first attempt to a running job."""
        self.run()
        self.clock.advance(30)
        self.store.jobs.update_attempt(
            self.attempt(1).key, registered_at=self.clock(), probe_status="pass"
        )
        self.report(1, "job_started", pid=1)
        self.run()

    def interrupt(self, warning: timedelta = timedelta(minutes=2)) -> datetime:
        """An AWS interruption notice on attempt 1; returns the power-off it announces."""
        off = self.clock() + warning
        self.report(1, "interruption_notice", action="terminate", time=off.isoformat())
        return off

    def left(self) -> list[Any]:
        return self.store.events.list_events(
            kind=EventKind.JOB_INSTANCE_LEFT_TO_CLOUD, job_id=self.job_id
        )
